//! Real peers on our fabric: Debian's OpenSM and infiniband-diags.
//!
//! Real peers on our fabric (issue 10, "Real OpenSM and the diags attach
//! to the fabric"): Debian's OpenSM and infiniband-diags, run under
//! `LD_PRELOAD=libumad2sim.so`, attach through our ibsim server to a
//! fabric of one switch and three host nodes, and we check what they
//! report against the model. Skipped loudly when the packages are absent.

mod bench;
mod protocol;
mod rig;
mod stray;
mod subnet;
mod sweep;
mod vs_ibsim;
