//! The README's axum + tower-http example is `src/bin/axum_tower_http.rs`, which is
//! compiled with the crate (the README block itself is `ignore`: the bridge's README doc
//! tests build without the `axum` feature).

#[test]
fn the_readme_axum_example_is_the_compiled_one() {
    let readme = include_str!("../../README.md");
    let code = include_str!("../src/bin/axum_tower_http.rs");
    assert!(
        readme.contains(&format!("```rust,ignore\n{code}```\n")),
        "the README's axum + tower-http block differs from examples/src/bin/axum_tower_http.rs: \
         copy the file into the README"
    );
}
