//! Credentials for Tempo and Pyroscope: bearer token, basic auth, tenant.

use crate::QueryError;

/// How requests authenticate, and which tenant they read.
///
/// Grafana Cloud's Tempo and Pyroscope take basic auth (the stack's user id and a token);
/// a self-hosted multi-tenant deployment takes `X-Scope-OrgID`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Auth {
    /// `Authorization: Bearer <token>`.
    pub bearer_token: Option<String>,
    /// `Authorization: Basic` user and password.
    pub basic: Option<(String, String)>,
    /// `X-Scope-OrgID`.
    pub tenant_id: Option<String>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a secret.
        f.debug_struct("Auth")
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "<set>"))
            .field("basic_user", &self.basic.as_ref().map(|(u, _)| u))
            .field("tenant_id", &self.tenant_id)
            .finish()
    }
}

impl Auth {
    /// Reads `<PREFIX>_AUTH_TOKEN`, `<PREFIX>_BASIC_AUTH_USER` / `_PASSWORD` and
    /// `<PREFIX>_TENANT_ID` (`PYROSCOPE_*` are the exporter's own variables). Empty values
    /// count as unset.
    ///
    /// # Errors
    /// A token and basic auth both set, or a basic user without a password (or the
    /// reverse), naming the variables.
    ///
    /// ```
    /// let auth = otel_profiling_query::Auth::from_env("TEMPO").unwrap();
    /// assert_eq!(auth, otel_profiling_query::Auth::default()); // nothing set here
    /// ```
    pub fn from_env(prefix: &str) -> Result<Auth, QueryError> {
        Auth::from_lookup(prefix, |name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) over `lookup` (a test's map, say).
    pub fn from_lookup(
        prefix: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Auth, QueryError> {
        let get = |suffix: &str| {
            let name = format!("{prefix}_{suffix}");
            let value = lookup(&name).filter(|v| !v.trim().is_empty());
            (name, value)
        };
        let (token_name, token) = get("AUTH_TOKEN");
        let (user_name, user) = get("BASIC_AUTH_USER");
        let (password_name, password) = get("BASIC_AUTH_PASSWORD");
        let (_, tenant_id) = get("TENANT_ID");
        let basic = match (user, password) {
            (Some(u), Some(p)) => Some((u, p)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(QueryError::Setting {
                    name: password_name,
                    message: format!("{user_name} is set without a password"),
                })
            }
            (None, Some(_)) => {
                return Err(QueryError::Setting {
                    name: user_name,
                    message: format!("{password_name} is set without a user"),
                })
            }
        };
        if token.is_some() && basic.is_some() {
            return Err(QueryError::Setting {
                name: token_name,
                message: format!("set either it or {user_name}/_PASSWORD, not both"),
            });
        }
        Ok(Auth {
            bearer_token: token,
            basic,
            tenant_id,
        })
    }

    /// Adds the headers to `request`.
    pub(crate) fn apply(
        &self,
        mut request: reqwest::blocking::RequestBuilder,
    ) -> reqwest::blocking::RequestBuilder {
        if let Some(token) = &self.bearer_token {
            request = request.bearer_auth(token);
        }
        if let Some((user, password)) = &self.basic {
            request = request.basic_auth(user, Some(password));
        }
        if let Some(tenant) = &self.tenant_id {
            request = request.header("X-Scope-OrgID", tenant);
        }
        request
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn auth(vars: &[(&str, &str)]) -> Result<Auth, QueryError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Auth::from_lookup("TEMPO", |n| map.get(n).cloned())
    }

    #[test]
    fn reads_each_kind_and_names_the_variable_of_a_bad_combination() {
        let a = auth(&[("TEMPO_AUTH_TOKEN", "t"), ("TEMPO_TENANT_ID", "acme")]).unwrap();
        assert_eq!(a.bearer_token.as_deref(), Some("t"));
        assert_eq!(a.tenant_id.as_deref(), Some("acme"));
        let b = auth(&[
            ("TEMPO_BASIC_AUTH_USER", "123"),
            ("TEMPO_BASIC_AUTH_PASSWORD", "s"),
        ])
        .unwrap();
        assert_eq!(b.basic, Some(("123".into(), "s".into())));
        assert!(!format!("{b:?}").contains("\"s\""), "no secret in Debug");
        let e = auth(&[("TEMPO_BASIC_AUTH_USER", "123")]).unwrap_err();
        assert!(
            e.to_string().starts_with("TEMPO_BASIC_AUTH_PASSWORD:"),
            "{e}"
        );
        let e = auth(&[
            ("TEMPO_AUTH_TOKEN", "t"),
            ("TEMPO_BASIC_AUTH_USER", "u"),
            ("TEMPO_BASIC_AUTH_PASSWORD", "p"),
        ])
        .unwrap_err();
        assert!(e.to_string().starts_with("TEMPO_AUTH_TOKEN:"), "{e}");
        assert_eq!(auth(&[("TEMPO_AUTH_TOKEN", " ")]).unwrap(), Auth::default());
    }
}
