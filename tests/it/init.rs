//! `triage init`: what it writes, and what it refuses (exit 2, nothing written): bad names, a
//! non-empty target, a folder that is not sqs-triage. Building the generated crate and running
//! its tests takes minutes on a shared machine, so `bash infra/check.sh` does it, with the
//! checks of its SAM template and CDK app.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_triage");
/// The library package: the repository's root, the `triage` package's parent.
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// A fresh folder under the system's temp folder, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> Self {
        let dir = std::env::temp_dir().join(support::unique_name(prefix));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn init(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("init")
        .args(args)
        .output()
        .expect("triage runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every file under `dir`, relative, sorted.
fn listing(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).expect("read dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn init_writes_the_crate_and_reports_its_files() {
    let tmp = TempDir::new("init-build");
    let dir = tmp.0.join("thumbnails");
    let out = init(&[
        "thumbnails",
        "--dir",
        dir.to_str().unwrap(),
        "--path",
        REPO,
        "--json",
    ]);
    assert!(out.status.success(), "init failed: {}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let mut files: Vec<String> = serde_json::from_value(report["files"].clone()).unwrap();
    files.sort();
    assert_eq!(files, listing(&dir), "the report lists what was written");
    for f in [
        "Cargo.toml",
        "src/main.rs",
        "template.yaml",
        "cdk/bin/app.ts",
        "cdk/lib/sqs-triage.ts",
    ] {
        assert!(files.iter().any(|x| x == f), "{f} missing from {files:?}");
    }
    let cargo = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let repo = std::fs::canonicalize(REPO).unwrap();
    assert!(
        cargo.contains(&format!("sqs-triage = {{ path = \"{}\" }}", repo.display())),
        "{cargo}"
    );

    // The handler is registered in the Lambda runtime as triage-lambda's is.
    let main = std::fs::read_to_string(dir.join("src/main.rs")).unwrap();
    assert!(
        main.contains("pub const JOB_TYPE: &str = \"thumbnails\";"),
        "{main}"
    );
    assert!(
        main.contains("sqs_triage::lambda::run(registry()).await"),
        "{main}"
    );
    let sam = std::fs::read_to_string(dir.join("template.yaml")).unwrap();
    assert!(
        sam.contains("\n  BinaryName:\n") && sam.contains("    Default: thumbnails\n"),
        "BinaryName default"
    );
}

/// `--runtime python` and `--runtime node`: a handler of that language, its tests, the layer's
/// helpers for them, and both stacks with the layer; no crate.
#[test]
fn init_runtime_python_and_node_write_a_handler_its_tests_and_both_stacks() {
    let tmp = TempDir::new("init-runtime");
    for (runtime, handler, test, runtime_line) in [
        (
            "python",
            "src/handler.py",
            "tests/test_handler.py",
            "      Runtime: python3.13\n",
        ),
        (
            "node",
            "src/handler.mjs",
            "test/handler.test.mjs",
            "      Runtime: nodejs22.x\n",
        ),
    ] {
        let dir = tmp.0.join(runtime);
        let out = init(&[
            "thumbnails",
            "--runtime",
            runtime,
            "--dir",
            dir.to_str().unwrap(),
            "--path",
            REPO,
            "--json",
        ]);
        assert!(out.status.success(), "{runtime}: {}", text(&out.stderr));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
        let mut files: Vec<String> = serde_json::from_value(report["files"].clone()).unwrap();
        files.sort();
        assert_eq!(
            files,
            listing(&dir),
            "{runtime}: the report lists what was written"
        );
        for f in [handler, test, "template.yaml", "cdk/bin/app.ts", "README.md"] {
            assert!(
                files.iter().any(|x| x == f),
                "{runtime}: {f} missing from {files:?}"
            );
        }
        assert!(!dir.join("Cargo.toml").exists(), "{runtime}: a Cargo.toml");
        let sam = std::fs::read_to_string(dir.join("template.yaml")).unwrap();
        assert!(sam.contains(runtime_line), "{runtime}: {sam}");
        assert!(
            sam.contains("      Layers: [!Ref TriageLayer]\n"),
            "{runtime}: no layer"
        );
        assert!(
            sam.contains("    Default: thumbnails\n"),
            "{runtime}: JobTypes default"
        );
    }
}

#[test]
fn a_runtime_it_does_not_write_is_refused_naming_the_three() {
    let tmp = TempDir::new("init-bad-runtime");
    let dir = tmp.0.join("out");
    let out = init(&[
        "thumbnails",
        "--runtime",
        "go",
        "--dir",
        dir.to_str().unwrap(),
        "--path",
        REPO,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("--runtime \"go\"") && err.contains("rust, python, node"),
        "{err}"
    );
    assert!(!dir.exists(), "{} was created", dir.display());
}

/// Without `--path`, the crate depends on the library package this `triage` was built from:
/// the repository's root, not the operator tool's own package.
#[test]
fn without_a_path_the_crate_depends_on_the_library_package() {
    let tmp = TempDir::new("init-default");
    let dir = tmp.0.join("jobs");
    let out = init(&["jobs", "--dir", dir.to_str().unwrap()]);
    assert!(out.status.success(), "init failed: {}", text(&out.stderr));
    let cargo = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let library = std::fs::canonicalize(REPO).unwrap();
    assert!(
        cargo.contains(&format!("sqs-triage = {{ path = \"{}\" }}", library.display())),
        "{cargo}"
    );
}

#[test]
fn bad_names_are_refused_with_nothing_written() {
    let tmp = TempDir::new("init-names");
    for name in ["Thumbnails", "under_score", "fn", "sqs-triage", "-x", ""] {
        let dir = tmp.0.join("out");
        // After `--`, so that "-x" is the name rather than a flag.
        let out = init(&["--dir", dir.to_str().unwrap(), "--path", REPO, "--", name]);
        assert_eq!(out.status.code(), Some(2), "{name:?}: {}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(
            err.starts_with(&format!("error: NAME {name:?}")),
            "{name:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(!dir.exists(), "{name:?}: {} was created", dir.display());
    }
}

#[test]
fn a_non_empty_target_is_refused_and_left_alone() {
    let tmp = TempDir::new("init-nonempty");
    let dir = tmp.0.join("jobs");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("Cargo.toml"), "mine").unwrap();
    let out = init(&["jobs", "--dir", dir.to_str().unwrap(), "--path", REPO]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("exists and is not empty: nothing was written"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(listing(&dir), vec!["Cargo.toml"]);
    assert_eq!(std::fs::read_to_string(dir.join("Cargo.toml")).unwrap(), "mine");

    // A file where the folder should be.
    let file = tmp.0.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let out = init(&["jobs", "--dir", file.to_str().unwrap(), "--path", REPO]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");

    // An empty folder is taken.
    let empty = tmp.0.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = init(&["jobs", "--dir", empty.to_str().unwrap(), "--path", REPO]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(empty.join("src/main.rs").exists());
}

#[test]
fn a_path_that_is_not_sqs_triage_is_refused() {
    let tmp = TempDir::new("init-path");
    let dir = tmp.0.join("jobs");
    for path in [tmp.0.clone(), Path::new(REPO).join("infra")] {
        let out = init(&[
            "jobs",
            "--dir",
            dir.to_str().unwrap(),
            "--path",
            path.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("pass --path with the folder of your sqs-triage checkout"),
            "{}",
            text(&out.stderr)
        );
        assert!(!dir.exists());
    }
}
