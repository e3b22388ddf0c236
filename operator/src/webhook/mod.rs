//! Webhook (stub).
