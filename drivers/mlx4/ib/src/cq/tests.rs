//! Tests of CQE parsing.
