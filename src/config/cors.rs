//! `server.http.cors_allow_origins`: which web origins a browser may call
//! the HTTP API's `/v1/` endpoints from (CORS), validated.

/// The origins browsers may call `/v1/` from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CorsOrigins {
    /// No CORS headers (the default): browsers refuse cross-origin calls.
    #[default]
    Off,
    /// `["*"]`: any origin (never with credentials).
    Any,
    /// These origins exactly, each `scheme://host[:port]` as a browser
    /// sends it in `Origin`.
    Only(Vec<String>),
}

impl CorsOrigins {
    /// Parses the configured list: empty (off), `["*"]` alone, or origins
    /// such as `https://app.example.com` or `http://localhost:3000`.
    pub fn parse(list: &[String]) -> Result<Self, String> {
        if list.is_empty() {
            return Ok(Self::Off);
        }
        if list.iter().any(|o| o.trim() == "*") {
            if list.len() > 1 {
                return Err(format!(
                    "{list:?}: \"*\" allows every origin and must be alone"
                ));
            }
            return Ok(Self::Any);
        }
        let mut origins = Vec::with_capacity(list.len());
        for o in list {
            let origin = Self::origin(o)?;
            if !origins.contains(&origin) {
                origins.push(origin);
            }
        }
        Ok(Self::Only(origins))
    }

    /// One origin, as browsers serialize it (lowercase scheme and host,
    /// no default port, no trailing slash).
    fn origin(text: &str) -> Result<String, String> {
        let hint = "give an origin such as https://app.example.com or http://localhost:3000 (scheme, host and port only), or \"*\" alone";
        let url = url::Url::parse(text.trim()).map_err(|e| format!("{text:?}: {e}; {hint}"))?;
        let bare = url.path() == "/"
            && url.query().is_none()
            && url.fragment().is_none()
            && url.username().is_empty()
            && url.password().is_none();
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() || !bare {
            return Err(format!("{text:?} is not an origin: {hint}"));
        }
        Ok(url.origin().ascii_serialization())
    }

    /// The `Access-Control-Allow-Origin` value for a request from
    /// `origin`, or `None` when it is not allowed.
    pub fn allow(&self, origin: &str) -> Option<String> {
        match self {
            Self::Off => None,
            Self::Any => Some("*".to_owned()),
            Self::Only(list) => list.iter().find(|o| *o == origin).cloned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &[&str]) -> Result<CorsOrigins, String> {
        CorsOrigins::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn origins_are_normalised_as_browsers_send_them_and_matched_exactly() {
        assert_eq!(parse(&[]), Ok(CorsOrigins::Off));
        assert_eq!(parse(&["*"]), Ok(CorsOrigins::Any));
        let only = parse(&[
            "HTTPS://App.Example.com/",
            "http://localhost:3000",
            "https://a.example:443",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            only,
            CorsOrigins::Only(vec![
                "https://app.example.com".into(),
                "http://localhost:3000".into(),
                "https://a.example".into(),
            ])
        );
        assert_eq!(
            only.allow("https://app.example.com").as_deref(),
            Some("https://app.example.com")
        );
        assert_eq!(only.allow("https://app.example.com.evil.test"), None);
        assert_eq!(only.allow("http://localhost:3001"), None);
        assert_eq!(CorsOrigins::Off.allow("http://localhost:3000"), None);
        assert_eq!(
            CorsOrigins::Any.allow("http://x.test").as_deref(),
            Some("*")
        );
    }

    #[test]
    fn paths_wildcards_in_a_list_and_other_schemes_are_refused() {
        for bad in [
            vec!["*", "https://a.example"],
            vec!["https://a.example/app"],
            vec!["https://a.example?x=1"],
            vec!["ftp://a.example"],
            vec!["a.example"],
            vec!["https://user@a.example"],
        ] {
            let e = parse(&bad).expect_err(&format!("{bad:?} accepted"));
            assert!(e.contains("origin"), "{bad:?}: {e}");
        }
    }
}
