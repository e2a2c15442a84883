//! Each completion-with-error syndrome from its real cause.
