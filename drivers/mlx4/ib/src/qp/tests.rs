//! Golden-byte tests of the send and receive WQEs.
