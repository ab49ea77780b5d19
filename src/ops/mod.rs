//! Operator actions: setup, send, DLQ inspection and replay, breaker control.
