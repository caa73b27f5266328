//! The HTTP plumbing both clients share: one base URL, auth, bounded timeouts, errors that
//! name the request.

use std::time::Duration;

use reqwest::blocking::{Client, RequestBuilder};
use reqwest::Url;
use serde_json::Value;

use crate::{Auth, QueryError};

/// Default timeout of one request (connect, send, read the whole answer).
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of an error answer's body a [`QueryError::Status`] keeps.
const BODY_LIMIT: usize = 2048;

/// One backend: its base URL, credentials and HTTP client.
#[derive(Clone, Debug)]
pub(crate) struct Backend {
    base: Url,
    auth: Auth,
    timeout: Duration,
    http: Client,
}

impl Backend {
    /// `base` must be an absolute http(s) URL; `setting` names it in the error.
    pub(crate) fn new(base: &str, setting: &str) -> Result<Backend, QueryError> {
        let bad = |message: String| QueryError::Setting {
            name: setting.to_owned(),
            message,
        };
        let trimmed = base.trim().trim_end_matches('/');
        let base = Url::parse(&format!("{trimmed}/"))
            .map_err(|e| bad(format!("{base:?} is not a URL: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none() {
            return Err(bad(format!("{base:?}: expected http://host[:port][/path]")));
        }
        if base.scheme() == "https" && !cfg!(feature = "tls") {
            return Err(bad(format!(
                "{base:?}: https needs the `tls` feature of otel-profiling-query"
            )));
        }
        Ok(Backend {
            base,
            auth: Auth::default(),
            timeout: DEFAULT_TIMEOUT,
            http: client(DEFAULT_TIMEOUT)?,
        })
    }

    pub(crate) fn base(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    pub(crate) fn set_auth(&mut self, auth: Auth) {
        self.auth = auth;
    }

    pub(crate) fn set_timeout(&mut self, timeout: Duration) -> Result<(), QueryError> {
        self.timeout = timeout;
        self.http = client(timeout)?;
        Ok(())
    }

    /// `path` (no leading slash) under the base URL, with `params` as its query string.
    fn url(&self, path: &str, params: &[(&str, String)]) -> Result<Url, QueryError> {
        let mut url = self.base.join(path).map_err(|e| QueryError::Setting {
            name: path.to_owned(),
            message: e.to_string(),
        })?;
        if !params.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(params.iter().map(|(k, v)| (*k, v.as_str())));
        }
        Ok(url)
    }

    /// `GET path?params`, JSON answer; `Ok(None)` for a 404.
    pub(crate) fn get_json(
        &self,
        path: &str,
        params: &[(&str, String)],
    ) -> Result<Option<Value>, QueryError> {
        let url = self.url(path, params)?;
        let request = format!("GET {url}");
        let builder = self.http.get(url).header("Accept", "application/json");
        self.send(request, builder, true)
    }

    /// A Connect unary call with a JSON body (`POST path`).
    pub(crate) fn post_connect_json(&self, path: &str, body: &Value) -> Result<Value, QueryError> {
        let url = self.url(path, &[])?;
        let request = format!("POST {url}");
        let builder = self
            .http
            .post(url)
            .header("Content-Type", "application/json")
            .header("Connect-Protocol-Version", "1")
            .body(body.to_string());
        self.send(request.clone(), builder, false)?
            .ok_or_else(|| QueryError::Decode {
                request,
                message: "empty answer".into(),
            })
    }

    fn send(
        &self,
        request: String,
        builder: RequestBuilder,
        none_on_404: bool,
    ) -> Result<Option<Value>, QueryError> {
        let transport = |e: reqwest::Error| QueryError::Transport {
            request: request.clone(),
            message: error_chain(&e),
        };
        let response = self.auth.apply(builder).send().map_err(transport)?;
        let status = response.status();
        let text = response.text().map_err(transport)?;
        if status.as_u16() == 404 && none_on_404 {
            return Ok(None);
        }
        if !status.is_success() {
            let mut body = text;
            if body.len() > BODY_LIMIT {
                let mut end = BODY_LIMIT;
                while !body.is_char_boundary(end) {
                    end -= 1;
                }
                body.truncate(end);
                body.push('…');
            }
            return Err(QueryError::Status {
                request,
                status: status.as_u16(),
                body: body.trim().to_owned(),
            });
        }
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| QueryError::Decode {
                request,
                message: format!("the answer is not JSON: {e}"),
            })
    }
}

fn client(timeout: Duration) -> Result<Client, QueryError> {
    Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .build()
        .map_err(|e| QueryError::Setting {
            name: "HTTP client".into(),
            message: error_chain(&e),
        })
}

/// `e` with its sources (reqwest's own message hides the cause: "error sending request").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
