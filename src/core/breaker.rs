//! The circuit breaker state machine (pure).
