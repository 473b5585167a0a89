//! Compiles kakehi's C++ glue to Bitcoin Core's script interpreter
//! (`src/validation/script/engine.cpp`).
//!
//! The interpreter is Bitcoin Core 26.0's, built by the `bitcoinconsensus`
//! crate (0.106.0+26.0) from the Core sources it vendors. The glue must be
//! compiled against exactly those headers (it uses Core's C++ types), so
//! this script asks cargo where that crate's sources are (`cargo metadata`,
//! offline first, which is enough once the build has fetched its
//! dependencies) and adds `depend/bitcoin/src` to the include path.
//!
//! On x86-64 it also compiles Core's own SHA-256 (`crypto/sha256.cpp`) as
//! bitcoind's build does, with the SSE4 assembly and the SHA-extension
//! transform (`USE_ASM`, `ENABLE_X86_SHANI`; the latter file alone with
//! `-msse4 -msha`, Core's `X86_SHANI_CXXFLAGS`); the crate builds only the
//! portable transform. These objects define every symbol of the crate's
//! `sha256.o` and are linked first (kakehi's archive comes before its
//! dependencies'), so the linker never takes the crate's copy; the glue
//! calls `SHA256AutoDetect` (`sha256_implementation`, logged at start).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The crate whose Core sources the glue is compiled against; must be the
/// version `Cargo.toml` pins.
const ENGINE_CRATE: &str = "bitcoinconsensus";
const ENGINE_VERSION: &str = "0.106.0+26.0";
const GLUE: &str = "src/validation/script/engine.cpp";

fn main() {
    println!("cargo:rerun-if-changed={GLUE}");
    println!("cargo:rerun-if-changed=Cargo.lock");
    let core_src = engine_sources().join("depend/bitcoin/src");
    if !core_src.join("script/interpreter.h").is_file() {
        panic!(
            "{} has no Bitcoin Core sources (script/interpreter.h)",
            core_src.display()
        );
    }
    let x86_64 = std::env::var("CARGO_CFG_TARGET_ARCH").is_ok_and(|a| a == "x86_64");
    let mut glue = core_build(&core_src);
    glue.flag_if_supported("-Werror=switch").file(GLUE);
    if x86_64 {
        glue.define("USE_ASM", None)
            .define("ENABLE_X86_SHANI", None)
            .file(core_src.join("crypto/sha256.cpp"))
            .file(core_src.join("crypto/sha256_sse4.cpp"));
    }
    glue.compile("kakehi_script_engine");
    if x86_64 {
        core_build(&core_src)
            .define("ENABLE_X86_SHANI", None)
            .flag("-msse4")
            .flag("-msha")
            .file(core_src.join("crypto/sha256_x86_shani.cpp"))
            .compile("kakehi_sha256_shani");
    }
}

/// A C++17 build against Core's sources, optimised even in debug builds
/// (the glue and the hashing are on the hot path of block validation, as
/// the interpreter itself is).
fn core_build(core_src: &Path) -> cc::Build {
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .include(core_src)
        .include(core_src.join("secp256k1/include"))
        .define("__STDC_FORMAT_MACROS", None)
        .flag_if_supported("-Wno-unused-parameter")
        .opt_level(2);
    build
}

/// The directory of the `bitcoinconsensus` package, from `cargo metadata`.
fn engine_sources() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("Cargo.toml");
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let metadata = |offline: bool| {
        let mut cmd = Command::new(&cargo);
        cmd.args([
            "metadata",
            "--format-version",
            "1",
            "--filter-platform",
            &target,
        ]);
        if offline {
            cmd.arg("--offline");
        }
        cmd.arg("--manifest-path").arg(&manifest);
        cmd.output()
    };
    let output = match metadata(true) {
        Ok(out) if out.status.success() => out,
        // Not everything cached yet (a `cargo build` does not fetch
        // dev-dependencies): let cargo fetch what metadata needs.
        _ => match metadata(false) {
            Ok(out) if out.status.success() => out,
            Ok(out) => panic!(
                "cargo metadata failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => panic!("cannot run {cargo} metadata: {e}"),
        },
    };
    let json: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let packages = json["packages"].as_array().expect("metadata has packages");
    let package = packages
        .iter()
        .find(|p| p["name"] == ENGINE_CRATE && p["version"] == ENGINE_VERSION)
        .unwrap_or_else(|| panic!("{ENGINE_CRATE} {ENGINE_VERSION} is not a dependency"));
    let manifest_path = package["manifest_path"]
        .as_str()
        .expect("a package has a manifest_path");
    Path::new(manifest_path)
        .parent()
        .expect("a manifest path has a parent")
        .to_path_buf()
}
