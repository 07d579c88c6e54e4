//! Every example configuration shipped in `examples/` passes `zgix --check`, and the demo config really serves.

mod support;

use std::path::PathBuf;

use support::*;

fn examples() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_example_config_passes_zgix_check() {
    let files = examples();
    assert!(
        files.len() >= 2,
        "expected the demo and edge examples, found {files:?}"
    );
    for f in &files {
        let path = f.to_str().unwrap();
        let run = run_zgix(&["--check", "--config", path]);
        assert!(
            run.status.success(),
            "zgix --check {path} failed: {}",
            run.stderr
        );
        assert!(
            run.stderr.contains("is valid"),
            "zgix --check {path} printed: {}",
            run.stderr
        );
    }
}

#[test]
fn check_refuses_an_example_with_one_field_broken() {
    // The same document with a typo must be refused with its JSON path, so the
    // test above cannot pass by --check accepting anything.
    let demo = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/demo.json"),
    )
    .unwrap();
    let broken = demo.replacen("\"cluster\"", "\"clustr\"", 1);
    assert_ne!(broken, demo, "demo.json has no cluster field to break");
    let cfg = TempConfig::new(&broken);
    let run = run_zgix(&["--check", "--config", cfg.path.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(1), "stderr: {}", run.stderr);
    assert!(
        run.stderr.contains("listeners[0].http.clustr"),
        "stderr: {}",
        run.stderr
    );
}
