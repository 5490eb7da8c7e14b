//! Lease tokens and their durable counters (lease mode), on both backends.
