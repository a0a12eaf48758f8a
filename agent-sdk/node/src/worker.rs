//! `Worker` and `Task`.
