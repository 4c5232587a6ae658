//! The benchmark itself runs end to end (`--quick`, one cheap section) and writes its report.

use std::path::PathBuf;
use std::process::Command;

/// Runs the benchmark with `args` and a fresh `--out` directory; asserts it succeeded and
/// returns its stdout and that directory.
fn run_bench(args: &[&str]) -> (String, PathBuf) {
    let out = std::env::temp_dir().join(format!(
        "fairlock-bench-test-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let output = Command::new(env!("CARGO_BIN_EXE_fairlock-bench"))
        .args(args)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {}\n{stdout}\n{stderr}",
        output.status
    );
    (stdout, out)
}

#[test]
fn quick_uncontended_section_reports_markdown_and_json() {
    let (stdout, out) = run_bench(&["--quick", "--only", "uncontended", "--pool-size", "2"]);
    assert!(
        stdout.contains("| figure | value | target | result |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("EVALSHA `return 1` round trip p50"),
        "{stdout}"
    );
    assert!(stdout.contains("`lock()` acquire p50"), "{stdout}");

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("latest.json")).unwrap()).unwrap();
    assert_eq!(json["run"]["pool_size"], 2);
    let keys: Vec<&str> = json["sections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|section| section["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["limit", "uncontended"]);

    // The ratio target counts in the round trips measured in section 2's own blocks, not
    // section 1's (the machine drifts between sections).
    let figures = json["sections"][1]["figures"].as_array().unwrap();
    let value = |name: &str| {
        let figure = figures
            .iter()
            .find(|figure| figure["name"] == name)
            .unwrap_or_else(|| panic!("no figure {name:?}: {figures:?}"));
        (figure["value"].as_f64().unwrap(), figure)
    };
    let (acquire, _) = value("`lock()` acquire p50");
    let (beside, _) = value("EVALSHA `return 1` round trip p50, in blocks between these");
    let (ratio, target) = value("`lock()` acquire p50 / EVALSHA p50 (in blocks between these)");
    assert!(beside > 0.0, "{beside}");
    assert!(
        (ratio - acquire / beside).abs() < 1e-3 * ratio,
        "{ratio} vs {acquire} / {beside}"
    );
    assert_eq!(target["target"], "<= 1.5x");
    let _ = std::fs::remove_dir_all(&out);
}

/// The script section alone, on a server where nothing has loaded the function library yet:
/// its warm-up call loads it (two script calls), which the section once took for a wrong count
/// and failed with "uncontended acquire: expected one script call, the server ran 2".
#[test]
fn the_scripts_section_runs_alone_on_a_fresh_server() {
    let (stdout, out) = run_bench(&["--quick", "--only", "scripts"]);
    assert!(
        stdout.contains("server time: release with hand-over"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Redis commands per call: uncontended acquire"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
