//! Leaks `reqwest::blocking::Client` through a public function: the check must say so.

/// An HTTP client, naming reqwest's type in this crate's public API.
pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::new()
}
