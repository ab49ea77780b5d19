//! `triage init`: a crate of one's own around sqs-triage — a typed handler with a fatal and a
//! transient path and its unit tests, and the SAM template and CDK app that build and deploy
//! that crate with the same resources as the reference stack.
//!
//! The files are templates under `triage/src/ops/init/`; the SAM template is `infra/template.yaml`
//! with its `CrateDir` / `BinaryName` defaults pointing at the new crate, and the CDK app uses a
//! copy of `infra/cdk/lib/sqs-triage.ts` (the `SqsTriage` construct). Nothing is overwritten:
//! the target folder must be missing or empty, and every file is created with `create_new`.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::ops::output::Report;
use crate::ops::{OpsError, OpsResult};

const CARGO_TOML: &str = include_str!("init/Cargo.toml.in");
const MAIN_RS: &str = include_str!("init/main.rs.in");
const README: &str = include_str!("init/README.md.in");
const GITIGNORE: &str = include_str!("init/gitignore.in");
const SAMCONFIG: &str = include_str!("init/samconfig.toml.in");
const CDK_JSON: &str = include_str!("init/cdk/cdk.json.in");
const CDK_APP: &str = include_str!("init/cdk/app.ts.in");
const CDK_GITIGNORE: &str = include_str!("init/cdk/gitignore.in");
/// The reference SAM template: the generated one differs in its build parameters' defaults.
const SAM_TEMPLATE: &str = include_str!("../../../infra/template.yaml");
/// The SqsTriage construct, copied into the generated CDK app.
const CONSTRUCT: &str = include_str!("../../../infra/cdk/lib/sqs-triage.ts");
/// The CDK app's packages: the generated app pins the same versions.
const CDK_PACKAGE: &str = include_str!("../../../infra/cdk/package.json");
const CDK_TSCONFIG: &str = include_str!("../../../infra/cdk/tsconfig.json");
/// The Python variant's SAM template (infra/template.yaml with the function through the layer).
const SAM_PYTHON_TEMPLATE: &str = include_str!("../../../infra/template-python.yaml");
/// The layer's Python helpers, copied for the generated tests (the function gets the layer's).
const PYTHON_HELPERS: &str = include_str!("../../../infra/layer/python/sqs_triage/__init__.py");
const PY_HANDLER: &str = include_str!("init/python/handler.py.in");
const PY_TEST: &str = include_str!("init/python/test_handler.py.in");
const PY_README: &str = include_str!("init/python/README.md.in");
const PY_GITIGNORE: &str = include_str!("init/python/gitignore.in");
const PY_CDK_APP: &str = include_str!("init/python/cdk/app.ts.in");
/// The layer's Node.js helpers, copied for the generated tests (the function gets the layer's).
const NODE_HELPERS: &str = include_str!("../../../infra/layer/nodejs/node_modules/sqs-triage/index.js");
const NODE_HANDLER: &str = include_str!("init/node/handler.mjs.in");
const NODE_TEST: &str = include_str!("init/node/handler.test.mjs.in");
const NODE_PACKAGE: &str = include_str!("init/node/package.json.in");
const NODE_README: &str = include_str!("init/node/README.md.in");
const NODE_GITIGNORE: &str = include_str!("init/node/gitignore.in");
const NODE_CDK_APP: &str = include_str!("init/node/cdk/app.ts.in");

/// The language of the generated handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Runtime {
    /// A Rust crate around sqs-triage (the default).
    #[default]
    Rust,
    /// A Python handler run through the sqs-triage layer.
    Python,
    /// A Node.js handler run through the sqs-triage layer.
    Node,
}

/// The values `--runtime` takes.
pub const RUNTIMES: &[&str] = &["rust", "python", "node"];

impl std::str::FromStr for Runtime {
    type Err = OpsError;

    fn from_str(s: &str) -> Result<Self, OpsError> {
        match s {
            "rust" => Ok(Runtime::Rust),
            "python" => Ok(Runtime::Python),
            "node" => Ok(Runtime::Node),
            other => Err(OpsError::usage(format!(
                "--runtime {other:?} is not one `triage init` writes: use one of {}",
                RUNTIMES.join(", ")
            ))),
        }
    }
}

/// The longest NAME: the function is `<NAME>-triage-lambda`, and Lambda names take 64 characters.
pub const MAX_NAME_LEN: usize = 64 - "-triage-lambda".len();

/// Names cargo refuses for a package (Rust keywords, its own folders, the standard crates).
const RESERVED: &[&str] = &[
    "as",
    "async",
    "await",
    "break",
    "const",
    "continue",
    "crate",
    "dyn",
    "else",
    "enum",
    "extern",
    "false",
    "fn",
    "for",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "match",
    "mod",
    "move",
    "mut",
    "pub",
    "ref",
    "return",
    "self",
    "static",
    "struct",
    "super",
    "trait",
    "true",
    "type",
    "unsafe",
    "use",
    "where",
    "while",
    "abstract",
    "become",
    "box",
    "do",
    "final",
    "gen",
    "macro",
    "override",
    "priv",
    "try",
    "typeof",
    "unsized",
    "virtual",
    "yield",
    "test",
    "deps",
    "examples",
    "build",
    "incremental",
    "std",
    "core",
    "alloc",
    "proc-macro",
    "con",
    "prn",
    "aux",
    "nul",
    "com1",
    "com2",
    "com3",
    "com4",
    "com5",
    "com6",
    "com7",
    "com8",
    "com9",
    "lpt1",
    "lpt2",
    "lpt3",
    "lpt4",
    "lpt5",
    "lpt6",
    "lpt7",
    "lpt8",
    "lpt9",
];

/// What `triage init` does.
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// The crate's name: also its binary, its job type and the default stack name.
    pub name: String,
    /// The folder to write the crate into (default: `./NAME`).
    pub dir: Option<PathBuf>,
    /// The sqs-triage checkout to depend on by path.
    pub sqs_triage: Option<PathBuf>,
    /// The handler's language.
    pub runtime: Runtime,
}

/// What `triage init` wrote.
#[derive(Debug, Clone, Serialize)]
pub struct InitReport {
    /// The crate's name (binary, job type, stack name).
    pub name: String,
    /// The folder it was written to.
    pub dir: String,
    /// How the crate depends on sqs-triage (the `Cargo.toml` value).
    pub dependency: String,
    /// The files written, relative to `dir`.
    pub files: Vec<String>,
}

impl Report for InitReport {
    fn human(&self) -> String {
        let through = if self.files.iter().any(|f| f == "Cargo.toml") {
            format!("sqs-triage = {}", self.dependency)
        } else {
            "through the sqs-triage layer".to_owned()
        };
        let mut out = format!("created {} (job type `{}`, {through}):\n", self.dir, self.name);
        for f in &self.files {
            out.push_str(&format!("  {f}\n"));
        }
        let layer = "LAYER_ARCHS=arm64 LAYER_OUT=\"$PWD/layer\" bash <sqs-triage>/infra/layer/build.sh";
        let test = if self.files.iter().any(|f| f.ends_with(".py")) {
            format!("python3 -m unittest\n  {layer}")
        } else if self.files.iter().any(|f| f.ends_with(".mjs")) {
            format!("node --test\n  {layer}")
        } else {
            "cargo test".to_owned()
        };
        out.push_str(&format!(
            "\nnext:\n  cd {}\n  {test}\n  sam build && sam deploy --guided      # or: cd cdk && npm install && npx cdk deploy\n",
            shell_word(&self.dir)
        ));
        out
    }
}

/// Why `name` cannot name the crate, or `Ok`. The name is also the binary, the job type and
/// the stack name (CloudFormation takes no `_`), and prefixes the function's name.
pub fn check_name(name: &str) -> OpsResult<()> {
    let bad = |why: &str| {
        Err(OpsError::usage(format!(
            "NAME {name:?} {why}: use 1 to {MAX_NAME_LEN} lowercase letters, digits and '-', starting with a letter (it names the crate, its binary, its job type and the stack), e.g. `triage init thumbnails`"
        )))
    };
    let mut chars = name.chars();
    match chars.next() {
        None => return bad("is empty"),
        Some(c) if !c.is_ascii_lowercase() => return bad("does not start with a lowercase letter"),
        _ => {}
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return bad(&format!("has {c:?}"));
    }
    if name.len() > MAX_NAME_LEN {
        return bad(&format!("is {} characters long", name.len()));
    }
    if name.ends_with('-') || name.contains("--") {
        return bad("has a '-' at its end or two in a row");
    }
    if RESERVED.contains(&name) {
        return bad("is a name cargo reserves (a Rust keyword or one of its own)");
    }
    if name == "sqs-triage" {
        return bad("is the name of the library it depends on");
    }
    Ok(())
}

/// The sqs-triage checkout to depend on: `--path` when given, otherwise the one this `triage`
/// was built from, as long as it is still there. The crate is not on a registry.
pub fn sqs_triage_dir(given: Option<&Path>) -> OpsResult<PathBuf> {
    let (dir, from) = match given {
        Some(p) => (p.to_path_buf(), "--path"),
        None => (
            // The library is the workspace's root package: this package's parent folder.
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap_or(Path::new(".."))
                .to_path_buf(),
            "the checkout this `triage` was built from",
        ),
    };
    let manifest = dir.join("Cargo.toml");
    let text = fs::read_to_string(&manifest).map_err(|e| {
        OpsError::usage(format!(
            "{} ({from}) has no readable Cargo.toml ({e}): pass --path with the folder of your sqs-triage checkout",
            dir.display()
        ))
    })?;
    if !text.lines().any(|l| l.trim() == r#"name = "sqs-triage""#) {
        return Err(OpsError::usage(format!(
            "{} ({from}) is not the sqs-triage crate: pass --path with the folder of your sqs-triage checkout",
            manifest.display()
        )));
    }
    fs::canonicalize(&dir).map_err(|e| OpsError::usage(format!("cannot resolve {}: {e}", dir.display())))
}

/// The generated crate's files: (path relative to its folder, contents). Pure: nothing is
/// written, so every problem shows before the first file.
pub fn files(name: &str, sqs_triage: &Path) -> OpsResult<Vec<(&'static str, String)>> {
    files_for(name, sqs_triage, Runtime::Rust)
}

/// The generated project's files for `runtime`.
pub fn files_for(name: &str, sqs_triage: &Path, runtime: Runtime) -> OpsResult<Vec<(&'static str, String)>> {
    check_name(name)?;
    let path = sqs_triage.to_str().ok_or_else(|| {
        OpsError::usage(format!(
            "the sqs-triage path {} is not UTF-8: Cargo.toml cannot name it",
            sqs_triage.display()
        ))
    })?;
    let dependency = format!("{{ path = {} }}", toml_string(path));
    let fill = |t: &str| {
        t.replace("{{name}}", name)
            .replace("{{sqs_triage}}", &dependency)
            .replace("{{sqs_triage_dir}}", &shell_word(path))
    };
    // The runtime's own files, SAM template and CDK app (its bin/app.ts); then the stacks'
    // files, each project's the same but for those two.
    let (mut made, template, app) = match runtime {
        Runtime::Python => (
            vec![
                ("src/handler.py", fill(PY_HANDLER)),
                ("tests/__init__.py", String::new()),
                ("tests/test_handler.py", fill(PY_TEST)),
                ("tests/layer/sqs_triage/__init__.py", PYTHON_HELPERS.to_owned()),
                ("README.md", fill(PY_README)),
                (".gitignore", PY_GITIGNORE.to_owned()),
            ],
            sam_python_template(name)?,
            PY_CDK_APP,
        ),
        Runtime::Node => (
            vec![
                ("src/handler.mjs", fill(NODE_HANDLER)),
                ("src/package.json", fill(NODE_PACKAGE)),
                ("test/handler.test.mjs", fill(NODE_TEST)),
                ("node_modules/sqs-triage/index.js", NODE_HELPERS.to_owned()),
                ("README.md", fill(NODE_README)),
                (".gitignore", NODE_GITIGNORE.to_owned()),
            ],
            sam_node_template(name)?,
            NODE_CDK_APP,
        ),
        Runtime::Rust => (
            vec![
                ("Cargo.toml", fill(CARGO_TOML)),
                ("src/main.rs", fill(MAIN_RS)),
                ("README.md", fill(README)),
                (".gitignore", GITIGNORE.to_owned()),
            ],
            sam_template(name)?,
            CDK_APP,
        ),
    };
    made.extend([
        ("template.yaml", template),
        ("samconfig.toml", fill(SAMCONFIG)),
        ("cdk/package.json", cdk_package(name)?),
        ("cdk/cdk.json", fill(CDK_JSON)),
        ("cdk/tsconfig.json", CDK_TSCONFIG.to_owned()),
        ("cdk/bin/app.ts", fill(app)),
        ("cdk/lib/sqs-triage.ts", CONSTRUCT.to_owned()),
        ("cdk/.gitignore", CDK_GITIGNORE.to_owned()),
    ]);
    Ok(made)
}

/// infra/template.yaml with the build parameters' defaults naming the new crate (the template's
/// own folder) and its binary, and the function's description naming it.
pub fn sam_template(name: &str) -> OpsResult<String> {
    let mut out = SAM_TEMPLATE.to_owned();
    for (param, from, to) in [("CrateDir", "..", "."), ("BinaryName", "triage-lambda", name)] {
        out = replace_default(&out, param, from, to).ok_or_else(|| {
            OpsError::new(
                crate::ops::ErrorKind::Failed,
                format!("the embedded SAM template has no parameter {param} with Default {from} (please report it)"),
            )
        })?;
    }
    // The function's description names the crate's binary, as the CDK app's does.
    let description = "\n      Description: sqs-triage reference function (triage-lambda)\n";
    if out.matches(description).count() != 1 {
        return Err(OpsError::new(
            crate::ops::ErrorKind::Failed,
            "the embedded SAM template has no single function description to replace (please report it)",
        ));
    }
    Ok(out.replacen(
        description,
        &format!("\n      Description: {name} (sqs-triage)\n"),
        1,
    ))
}

/// infra/template-python.yaml for the generated project: its handler folder (`src`), its job
/// type, the layer zip in `layer/`, and the function's description naming it.
pub fn sam_python_template(name: &str) -> OpsResult<String> {
    let broken = |what: &str| {
        OpsError::new(
            crate::ops::ErrorKind::Failed,
            format!("the embedded Python SAM template has no {what} to replace (please report it)"),
        )
    };
    // The reference file's first two lines say how it is generated: not true of this copy.
    let mut out: String = SAM_PYTHON_TEMPLATE
        .split_inclusive('\n')
        .skip_while(|l| l.starts_with('#'))
        .collect();
    for (param, from, to) in [
        ("HandlerDir", "../examples/layer/python", "src"),
        ("JobTypes", "example.echo", name),
    ] {
        out = replace_default(&out, param, from, to).ok_or_else(|| broken(&format!("parameter {param}")))?;
    }
    for (from, to) in [
        (
            "\n      ContentUri: ../.local/layer/sqs-triage-layer-arm64.zip\n".to_owned(),
            "\n      ContentUri: layer/sqs-triage-layer-arm64.zip\n".to_owned(),
        ),
        (
            "\n      Description: sqs-triage reference function (Python, through the sqs-triage layer)\n"
                .to_owned(),
            format!("\n      Description: {name} (sqs-triage)\n"),
        ),
        (
            "\n  a dashboard: infra/template.yaml's resources, the layer added. `cdk synth -c runtime=python`\n  builds the same resources with the same settings.\n".to_owned(),
            "\n  a dashboard, the layer added. The CDK app in cdk/ builds the same resources with the\n  same settings.\n".to_owned(),
        ),
    ] {
        if out.matches(&from).count() != 1 {
            return Err(broken(from.trim()));
        }
        out = out.replacen(&from, &to, 1);
    }
    Ok(out)
}

/// The Python project's SAM template with the function and the layer on nodejs22.x.
pub fn sam_node_template(name: &str) -> OpsResult<String> {
    let mut out = sam_python_template(name)?;
    for (from, to) in [
        ("\n      Runtime: python3.13\n", "\n      Runtime: nodejs22.x\n"),
        (
            "\n      CompatibleRuntimes: [python3.13]\n",
            "\n      CompatibleRuntimes: [nodejs22.x]\n",
        ),
        (
            "\n  sqs-triage: a Python function through",
            "\n  sqs-triage: a Node.js function through",
        ),
    ] {
        if out.matches(from).count() != 1 {
            return Err(OpsError::new(
                crate::ops::ErrorKind::Failed,
                format!(
                    "the embedded Python SAM template has no {:?} to replace (please report it)",
                    from.trim()
                ),
            ));
        }
        out = out.replacen(from, to, 1);
    }
    Ok(out)
}

/// `text` with the line `    Default: from` of parameter `param` (in the block from `  param:`
/// to the next line indented less than 4 spaces) replaced, or `None` when it has no such line.
fn replace_default(text: &str, param: &str, from: &str, to: &str) -> Option<String> {
    let header = format!("\n  {param}:\n");
    let start = text.find(&header)? + header.len();
    let block_len = text[start..]
        .split_inclusive('\n')
        .take_while(|l| l.starts_with("    ") || l.trim().is_empty())
        .map(str::len)
        .sum::<usize>();
    let block = &text[start..start + block_len];
    let old = format!("    Default: {from}\n");
    // At a line's start: a deeper `      Default:` is another key's.
    let at = format!("\n{block}").find(&format!("\n{old}"))?;
    Some(format!(
        "{}{}    Default: {to}\n{}",
        &text[..start],
        &block[..at],
        &text[start + at + old.len()..]
    ))
}

/// The CDK app's package.json: infra/cdk's packages and versions, under the crate's name.
fn cdk_package(name: &str) -> OpsResult<String> {
    let embedded: serde_json::Value = serde_json::from_str(CDK_PACKAGE).map_err(|e| {
        OpsError::new(
            crate::ops::ErrorKind::Failed,
            format!("the embedded infra/cdk/package.json does not parse: {e} (please report it)"),
        )
    })?;
    let package = serde_json::json!({
        "name": format!("{name}-cdk"),
        "version": "0.1.0",
        "private": true,
        "description": format!("CDK app of {name}: its function behind SQS with sqs-triage's SqsTriage construct"),
        "scripts": {
            "synth": "cdk synth",
            "deploy": "cdk deploy",
            "typecheck": "tsc --noEmit"
        },
        "devDependencies": embedded["devDependencies"],
        "dependencies": embedded["dependencies"],
    });
    serde_json::to_string_pretty(&package)
        .map(|s| s + "\n")
        .map_err(|e| OpsError::new(crate::ops::ErrorKind::Failed, e.to_string()))
}

/// Writes the crate. Refuses a target that exists and is not an empty folder; creates every
/// file with `create_new`, so nothing that exists is ever overwritten.
pub fn init(options: &InitOptions) -> OpsResult<InitReport> {
    check_name(&options.name)?;
    let sqs_triage = sqs_triage_dir(options.sqs_triage.as_deref())?;
    let files = files_for(&options.name, &sqs_triage, options.runtime)?;
    let dir = options
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&options.name));
    match fs::read_dir(&dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(OpsError::usage(format!(
                    "{} exists and is not empty: nothing was written (choose another --dir, or empty it)",
                    dir.display()
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            let why = if dir.exists() {
                "is not a folder"
            } else {
                "cannot be read"
            };
            return Err(OpsError::usage(format!(
                "{} {why} ({e}): nothing was written",
                dir.display()
            )));
        }
    }
    let mut written = Vec::new();
    for (rel, contents) in &files {
        let path = dir.join(rel);
        write_new(&path, contents).map_err(|e| {
            OpsError::new(
                crate::ops::ErrorKind::Failed,
                format!(
                    "cannot create {}: {e} (written before it: {})",
                    path.display(),
                    if written.is_empty() {
                        "nothing".to_owned()
                    } else {
                        written.join(", ")
                    }
                ),
            )
        })?;
        written.push((*rel).to_owned());
    }
    Ok(InitReport {
        name: options.name.clone(),
        dir: dir.display().to_string(),
        dependency: format!("{{ path = {} }}", toml_string(&sqs_triage.display().to_string())),
        files: written,
    })
}

fn write_new(path: &Path, contents: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    let mut f = OpenOptions::new().write(true).create_new(true).open(path)?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `s` quoted for a POSIX shell when it needs it.
fn shell_word(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_name_a_crate_a_job_type_and_a_stack() {
        for ok in ["thumbnails", "email-send", "a", "job2", &"x".repeat(MAX_NAME_LEN)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Thumbnails",
            "2fa",
            "-x",
            "x-",
            "a--b",
            "under_score",
            "dot.ted",
            "sp ace",
            "fn",
            "test",
            "std",
            "sqs-triage",
            "ünïcode",
            "com2",
            "lpt9",
            &"x".repeat(MAX_NAME_LEN + 1),
        ] {
            let e = check_name(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
            assert!(e.message.starts_with(&format!("NAME {bad:?}")), "{e}");
        }
    }

    #[test]
    fn the_sam_template_is_the_reference_one_with_its_build_defaults_on_the_crate() {
        let generated = sam_template("thumbnails").unwrap();
        let changed: Vec<(&str, &str)> = SAM_TEMPLATE
            .lines()
            .zip(generated.lines())
            .filter(|(a, b)| a != b)
            .collect();
        assert_eq!(
            changed,
            vec![
                ("    Default: ..", "    Default: ."),
                ("    Default: triage-lambda", "    Default: thumbnails"),
                (
                    "      Description: sqs-triage reference function (triage-lambda)",
                    "      Description: thumbnails (sqs-triage)"
                ),
            ]
        );
        assert_eq!(SAM_TEMPLATE.lines().count(), generated.lines().count());
        assert!(generated.contains("      CodeUri: !Ref CrateDir\n"));
        assert!(generated.contains("        Binary: !Ref BinaryName\n"));
    }

    #[test]
    fn the_python_template_is_the_reference_one_with_the_project_s_handler_job_type_and_layer() {
        let generated = sam_python_template("thumbnails").unwrap();
        let reference: Vec<&str> = SAM_PYTHON_TEMPLATE.lines().skip(2).collect();
        let changed: Vec<(&str, &str)> = reference
            .iter()
            .copied()
            .zip(generated.lines())
            .filter(|(a, b)| a != b)
            .collect();
        assert_eq!(
            changed,
            vec![
                (
                    "  a dashboard: infra/template.yaml's resources, the layer added. `cdk synth -c runtime=python`",
                    "  a dashboard, the layer added. The CDK app in cdk/ builds the same resources with the"
                ),
                (
                    "  builds the same resources with the same settings.",
                    "  same settings."
                ),
                ("    Default: ../examples/layer/python", "    Default: src"),
                ("    Default: example.echo", "    Default: thumbnails"),
                (
                    "      ContentUri: ../.local/layer/sqs-triage-layer-arm64.zip",
                    "      ContentUri: layer/sqs-triage-layer-arm64.zip"
                ),
                (
                    "      Description: sqs-triage reference function (Python, through the sqs-triage layer)",
                    "      Description: thumbnails (sqs-triage)"
                ),
            ]
        );
        assert_eq!(reference.len(), generated.lines().count());
        assert!(!generated.starts_with('#'), "{}", &generated[..80]);
    }

    #[test]
    fn runtime_takes_rust_python_or_node_and_names_the_three_when_refused() {
        assert_eq!("rust".parse::<Runtime>().unwrap(), Runtime::Rust);
        assert_eq!("python".parse::<Runtime>().unwrap(), Runtime::Python);
        assert_eq!("node".parse::<Runtime>().unwrap(), Runtime::Node);
        assert_eq!(Runtime::default(), Runtime::Rust);
        for bad in ["Python", "py", "", "go", "nodejs"] {
            let e = bad.parse::<Runtime>().unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
            assert!(e.message.contains(&format!("--runtime {bad:?}")), "{e}");
            assert!(e.message.contains("use one of rust, python, node"), "{e}");
        }
    }

    /// The generated file at `name`.
    fn file<'a>(made: &'a [(&str, String)], name: &str) -> &'a str {
        &made
            .iter()
            .find(|(p, _)| *p == name)
            .unwrap_or_else(|| panic!("{name}"))
            .1
    }

    #[test]
    fn a_python_or_node_project_has_its_handler_tests_helpers_and_both_stacks() {
        // Per runtime: what its files say, and where its copy of the layer's helpers goes.
        let python: &[(&str, &str)] = &[
            (
                "src/handler.py",
                "from sqs_triage import Fatal, RetryAfter, Transient, job",
            ),
            ("tests/test_handler.py", "\"type\": \"thumbnails\""),
            ("cdk/bin/app.ts", "jobTypes: 'thumbnails'"),
            ("README.md", "bash /a/b/infra/layer/build.sh"),
        ];
        let node: &[(&str, &str)] = &[
            ("src/handler.mjs", "require('sqs-triage')"),
            ("cdk/bin/app.ts", "lambda.Runtime.NODEJS_22_X"),
        ];
        let table = [
            (
                Runtime::Python,
                python,
                ("tests/layer/sqs_triage/__init__.py", PYTHON_HELPERS),
            ),
            (
                Runtime::Node,
                node,
                ("node_modules/sqs-triage/index.js", NODE_HELPERS),
            ),
        ];
        for (runtime, says, (helpers_path, helpers)) in table {
            let made = files_for("thumbnails", Path::new("/a/b"), runtime).unwrap();
            for (path, text) in &made {
                assert!(!text.contains("{{"), "{path} keeps a placeholder");
                if path.ends_with(".json") {
                    serde_json::from_str::<serde_json::Value>(text).unwrap_or_else(|e| panic!("{path}: {e}"));
                }
            }
            for (path, needle) in says {
                assert!(file(&made, path).contains(needle), "{path} lacks {needle:?}");
            }
            assert_eq!(file(&made, helpers_path), helpers);
            assert!(!made.iter().any(|(p, _)| p.ends_with(".rs") || *p == "Cargo.toml"));
        }
    }

    #[test]
    fn a_node_project_s_template_is_the_python_one_but_for_the_runtime() {
        let made = files_for("thumbnails", Path::new("/a/b"), Runtime::Node).unwrap();
        // The function's and the layer's runtime, and the description.
        let python = sam_python_template("thumbnails").unwrap();
        let node = file(&made, "template.yaml");
        let changed: Vec<(&str, &str)> = python.lines().zip(node.lines()).filter(|(a, b)| a != b).collect();
        assert_eq!(changed.len(), 3, "{changed:?}");
        assert!(
            changed
                .iter()
                .all(|(_, b)| b.contains("nodejs22.x") || b.contains("Node.js")),
            "{changed:?}"
        );
    }

    #[test]
    fn a_default_is_replaced_only_in_its_own_parameter_and_at_a_line_start() {
        let t = "Parameters:\n  A:\n    Type: String\n    Default: x\n  B:\n    Default: y\n";
        assert_eq!(
            replace_default(t, "B", "y", "z").unwrap(),
            "Parameters:\n  A:\n    Type: String\n    Default: x\n  B:\n    Default: z\n"
        );
        assert_eq!(replace_default(t, "A", "y", "z"), None);
        assert_eq!(replace_default("\n  A:\n      Default: x\n", "A", "x", "z"), None);
    }

    #[test]
    fn the_cdk_app_pins_infra_cdk_packages() {
        let made: serde_json::Value = serde_json::from_str(&cdk_package("thumbnails").unwrap()).unwrap();
        let reference: serde_json::Value = serde_json::from_str(CDK_PACKAGE).unwrap();
        assert_eq!(made["dependencies"], reference["dependencies"]);
        assert_eq!(made["devDependencies"], reference["devDependencies"]);
        assert_eq!(made["name"], "thumbnails-cdk");
    }

    #[test]
    fn every_placeholder_is_filled() {
        for (path, text) in files("thumbnails", Path::new("/src/sqs \"triage\"")).unwrap() {
            assert!(!text.contains("{{"), "{path} keeps a placeholder");
        }
        let cargo = &files("thumbnails", Path::new("/a/b")).unwrap()[0].1;
        assert!(cargo.contains("sqs-triage = { path = \"/a/b\" }"), "{cargo}");
        assert_eq!(toml_string(r#"/x "y" \z"#), r#""/x \"y\" \\z""#);
    }

    #[test]
    fn the_crate_builds_fresh_and_on_its_own() {
        let made = files("thumbnails", Path::new("/a/b")).unwrap();
        let file = |name: &str| file(&made, name);
        // SAM's build cache hashes only the crate's folder: a cached build would keep an old
        // sqs-triage from the path dependency.
        assert!(
            !file("samconfig.toml").contains("cached = true"),
            "{}",
            file("samconfig.toml")
        );
        // Its own workspace, so it builds inside another crate's workspace folder too.
        assert!(
            file("Cargo.toml").contains("\n[workspace]\n"),
            "{}",
            file("Cargo.toml")
        );
        // Its tests check that the registry serves the job type the template and README name.
        assert!(file("src/main.rs").contains("fn the_registry_serves_the_job_type()"));
    }
}
