//! Shared helpers for the integration and QEMU tests.
