//! Rebuilds the `weir` binary when the SDK sources it carries (`weir init`,
//! cli/src/project.rs) change: `include_dir!` alone does not tell cargo about them.

fn main() {
    for dir in ["../guest-sdk/src", "../wit", "../guest-sdk/python/src/weir"] {
        println!("cargo:rerun-if-changed={dir}");
    }
}
