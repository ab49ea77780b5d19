//! The benchmark report: per-record cost against Powertools' `BatchProcessor`, AWS calls per
//! 1,000 messages on the local stack, the retry storm, the herd, and the cold start, measured
//! in one run and printed as markdown.
//!
//! ```sh
//! cargo bench --bench report                 # print the tables
//! cargo bench --bench report -- --write-docs # also write docs/benchmarks.md and docs/img/herd.svg
//! cargo bench --bench report -- --quick      # tiny inputs (what tests/it/bench_smoke.rs runs)
//! ```

#[path = "report/mod.rs"]
mod report;
// The integration tests' helpers: the report sets up its queues and tables as they do.
#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let given: Vec<String> = std::env::args().skip(1).collect();
    // `--once event|process FILE`: one pass over an event file, what the report runs under
    // valgrind to count instructions.
    if given.first().is_some_and(|a| a == "--once") {
        return match report::cost::once(&given[1..]) {
            Ok(t) => {
                println!("{t:?}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it:
    // then only the quick, local sections run, and what they cannot measure is not an error.
    let test_mode = !given.iter().any(|a| a == "--bench");
    let args: Vec<String> = if test_mode {
        ["--quick", "--skip", "calls,cold,fleet,billed,shipped"]
            .map(String::from)
            .to_vec()
    } else {
        given.clone()
    };
    // The repository's root (docs/, bench/, .local/): the parent of this package, triage/.
    let manifest = support::repo_root();
    let lambda_bin = Path::new(env!("CARGO_BIN_EXE_triage-lambda"));
    let mut opts = match report::Options::full(manifest, lambda_bin).parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    opts.once_exe = std::env::current_exe().ok().filter(|_| !test_mode);
    // A profile changed from the environment changes the binary measured: the command says so.
    opts.command = report::bench_command("report", &given);
    let mut r = report::run(&opts);
    println!("Command: `{}`\n\nMachine: {}\n", opts.command, r.machine);
    println!("{}", r.summary(&opts));
    print!("{}", r.markdown());
    if opts.write_docs {
        // The layer's section is `cargo bench --bench layer`'s: it stays as that bench wrote it.
        // A section this run skipped stays as the page had it, marked with its own run.
        let written = report::rewrite_page(manifest, |old| {
            r.keep_skipped(&opts, old);
            report::keep_layer_section(old, report::document(&opts, &r))
        });
        let path = match written {
            Ok(path) => path,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        eprintln!("report: wrote {}", path.display());
    }
    let failures = r.failures();
    for f in &failures {
        eprintln!("not measured: {f}");
    }
    if failures.is_empty() || test_mode {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
