//! Spans sent straight to X-Ray's OTLP traces endpoint (`https://xray.<region>.amazonaws.com/
//! v1/traces`), no collector layer in between: each export request is signed with SigV4 as the
//! service `xray`, with the function's own credentials. The endpoint takes a request as
//! `xray:PutTraceSegments` (which the functions' roles hold), and needs CloudWatch Transaction
//! Search turned on in the account (X-Ray's developer guide, "OTLP traces endpoint").

use std::time::SystemTime;

use aws_credential_types::Credentials;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// The service name X-Ray's OTLP endpoint is signed for.
const SERVICE: &str = "xray";

/// The Region of an X-Ray OTLP endpoint (`https://xray.eu-west-1.amazonaws.com/v1/traces`
/// gives `eu-west-1`); `None` for any other URL, whose requests go unsigned.
pub fn xray_region(endpoint: &str) -> Option<&str> {
    if !endpoint.starts_with("https://") {
        return None;
    }
    let host = crate::provider::host_of(endpoint)?;
    let region = host.strip_prefix("xray.")?.strip_suffix(".amazonaws.com")?;
    let valid = !region.is_empty()
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    valid.then_some(region)
}

/// The function's credentials as Lambda gives them (`AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`): fixed for the execution environment's life.
pub fn credentials_from_env() -> Option<Credentials> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    Some(Credentials::new(
        var("AWS_ACCESS_KEY_ID")?,
        var("AWS_SECRET_ACCESS_KEY")?,
        var("AWS_SESSION_TOKEN"),
        None,
        "environment",
    ))
}

/// An HTTP client that signs each request before `inner` sends it.
#[derive(Debug)]
pub struct Signed<C> {
    inner: C,
    region: String,
    credentials: Credentials,
}

impl<C> Signed<C> {
    /// `inner`, signing for X-Ray in `region` with `credentials`.
    pub fn new(inner: C, region: &str, credentials: Credentials) -> Self {
        Signed {
            inner,
            region: region.to_owned(),
            credentials,
        }
    }

    /// Signs `request` (its method, URL, headers and body) as of `now`.
    pub fn sign(&self, request: &mut Request<Bytes>, now: SystemTime) -> Result<(), HttpError> {
        use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
        let identity = self.credentials.clone().into();
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(SERVICE)
            .time(now)
            .settings(SigningSettings::default())
            .build()?
            .into();
        let uri = request.uri().to_string();
        let headers = request
            .headers()
            .iter()
            .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)));
        let signable = SignableRequest::new(
            request.method().as_str(),
            &uri,
            headers,
            SignableBody::Bytes(request.body()),
        )?;
        let (instructions, _) = sign(signable, &params)?.into_parts();
        instructions.apply_to_request_http1x(request);
        Ok(())
    }
}

#[async_trait::async_trait]
impl<C: HttpClient> HttpClient for Signed<C> {
    async fn send_bytes(&self, mut request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        self.sign(&mut request, SystemTime::now())?;
        self.inner.send_bytes(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_xray_endpoint_over_https_is_signed_and_its_region_read() {
        let region = |url| xray_region(url);
        assert_eq!(
            region("https://xray.eu-west-1.amazonaws.com/v1/traces"),
            Some("eu-west-1")
        );
        assert_eq!(
            region("http://xray.eu-west-1.amazonaws.com/v1/traces"),
            None
        );
        assert_eq!(region("http://localhost:4318/v1/traces"), None);
        assert_eq!(region("https://xray..amazonaws.com/v1/traces"), None);
        assert_eq!(region("https://xray.eu-west-1.amazonaws.com.evil/v1"), None);
    }
}
