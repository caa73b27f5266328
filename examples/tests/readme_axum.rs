//! The axum + tower-http example of docs/axum.md is `src/bin/axum_tower_http.rs`, which is
//! compiled with the crate (the block itself is `ignore`: the bridge's doc tests build without
//! the `axum` feature).

#[test]
fn the_readme_axum_example_is_the_compiled_one() {
    let readme = include_str!("../../docs/axum.md");
    let code = include_str!("../src/bin/axum_tower_http.rs");
    assert!(
        readme.contains(&format!("```rust,ignore\n{code}```\n")),
        "docs/axum.md's axum + tower-http block differs from examples/src/bin/axum_tower_http.rs: \
         copy the file into docs/axum.md"
    );
}
