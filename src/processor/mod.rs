//! The batch processor.
