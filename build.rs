//! Builds the output contracts of `contracts/` into the library: a deployment's registry ships
//! inside its binary, so no packaging step can leave it behind. Each `contracts/<id>.json`
//! becomes one `(id, text)` pair of `BUILT_IN_CONTRACTS`; they are compiled (and a bad one
//! refused) when the worker starts.

use std::fmt::Write;
use std::path::Path;

fn main() {
    let dir = Path::new("contracts");
    println!("cargo::rerun-if-changed=contracts");
    let mut files: Vec<(String, String)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let (Some(id), Some("json")) = (
                path.file_stem().and_then(|s| s.to_str()),
                path.extension().and_then(|s| s.to_str()),
            ) else {
                continue;
            };
            let absolute = std::fs::canonicalize(&path).expect("a contract file's path");
            println!("cargo::rerun-if-changed={}", path.display());
            files.push((id.to_owned(), absolute.display().to_string()));
        }
    }
    files.sort();
    let mut code = String::from("/// The contracts of `contracts/`, as `(id, file text)`.\n");
    code.push_str("pub(crate) const BUILT_IN_CONTRACTS: &[(&str, &str)] = &[\n");
    for (id, path) in &files {
        let _ = writeln!(code, "    ({id:?}, include_str!({path:?})),");
    }
    code.push_str("];\n");
    let out = std::env::var("OUT_DIR").expect("OUT_DIR");
    std::fs::write(Path::new(&out).join("contracts.rs"), code).expect("written");
}
