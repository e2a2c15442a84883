//! A strict software model of the ConnectX-3 (placeholder until the model lands).
