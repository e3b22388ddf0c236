//! Validation (stub).
