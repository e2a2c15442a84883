//! Links the kernel with the boot crate's linker script when building for the
//! kernel target.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let target = std::env::var("TARGET").unwrap_or_default();
    if target.contains("x86_64-target") {
        println!("cargo:rustc-link-arg=-T{dir}/../boot/linker.ld");
        println!("cargo:rustc-link-arg=--no-pie");
        println!("cargo:rustc-link-arg=-zmax-page-size=4096");
    }
    println!("cargo:rerun-if-changed={dir}/../boot/linker.ld");
}
