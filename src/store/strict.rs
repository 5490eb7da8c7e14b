//! Durable strict counters (strict mode), on both backends.
