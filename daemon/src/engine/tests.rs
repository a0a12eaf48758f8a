//! In-process tests of the engine.
