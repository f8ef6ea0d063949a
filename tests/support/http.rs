//! A scripted HTTP/1.1 server on 127.0.0.1 for the provider tests: each request is recorded
//! and answered by a route function (a JSON reply, a slow reply, or a dropped connection).
//! With [`Reply::Forward`] it is a loopback proxy in front of the emulator that stalls or
//! refuses chosen requests and passes the others on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A request as the server read it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// The body's bytes, as sent (a protobuf body is no text).
    pub raw: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// How the server answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A response with a JSON body and extra headers.
    Json {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    /// A `text/event-stream` answer, chunk by chunk: each event text after its pause; then
    /// the end of the stream, or with `stall` the connection held open, silent, for an hour.
    Events {
        parts: Vec<(Duration, String)>,
        stall: bool,
    },
    /// A binary stream (`content_type`), part by part, each after its pause; then its end, or
    /// with `stall` the connection held open, silent, for an hour.
    Bytes {
        content_type: &'static str,
        parts: Vec<(Duration, Vec<u8>)>,
        stall: bool,
    },
    /// The reply, after a pause.
    Slow(Duration, Box<Reply>),
    /// Read the request, then close the connection without answering.
    Drop,
    /// A JSON answer whose body is cut off: the head announces all of `body`, the first
    /// `sent` bytes follow, then the connection closes.
    Cut {
        status: u16,
        body: String,
        sent: usize,
    },
    /// Pass the request to the server at this base URL (`http://127.0.0.1:PORT`) and relay its
    /// answer.
    Forward(String),
    /// The reply, once the condition holds (asked every 10 ms) or the time is up: to order
    /// requests of different clients.
    When(Condition, Duration, Box<Reply>),
}

/// A condition a [`Reply::When`] waits for.
#[derive(Clone)]
pub struct Condition(pub Arc<dyn Fn() -> bool + Send + Sync>);

impl std::fmt::Debug for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Condition")
    }
}

/// A flag one route raises and another's [`Reply::When`] waits for.
#[derive(Debug, Clone, Default)]
pub struct Flag(Arc<std::sync::atomic::AtomicBool>);

impl Flag {
    pub fn raise(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_up(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The condition "this flag is up".
    pub fn condition(&self) -> Condition {
        let flag = self.clone();
        Condition(Arc::new(move || flag.is_up()))
    }
}

impl Reply {
    pub fn json(status: u16, body: serde_json::Value) -> Reply {
        Reply::Json {
            status,
            headers: Vec::new(),
            body: body.to_string(),
        }
    }

    pub fn with_header(self, name: &'static str, value: &str) -> Reply {
        match self {
            Reply::Json {
                status,
                mut headers,
                body,
            } => {
                headers.push((name, value.to_owned()));
                Reply::Json {
                    status,
                    headers,
                    body,
                }
            }
            other => other,
        }
    }
}

type Route = dyn Fn(&Request, &[Request]) -> Reply + Send + Sync;

/// The running server. Dropping it stops accepting.
pub struct HttpStub {
    pub url: String,
    requests: Arc<Mutex<Vec<Request>>>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpStub {
    /// Starts a server; `route` sees each request and every request before it.
    pub async fn start(
        route: impl Fn(&Request, &[Request]) -> Reply + Send + Sync + 'static,
    ) -> HttpStub {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let route: Arc<Route> = Arc::new(route);
        let seen = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (route, seen) = (Arc::clone(&route), Arc::clone(&seen));
                tokio::spawn(serve(stream, route, seen));
            }
        });
        HttpStub {
            url,
            requests,
            task,
        }
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().expect("requests").clone()
    }

    /// How many requests had this method and a path starting with `prefix`.
    pub fn count(&self, method: &str, prefix: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.method == method && r.path.starts_with(prefix))
            .count()
    }
}

impl Drop for HttpStub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut stream: TcpStream, route: Arc<Route>, seen: Arc<Mutex<Vec<Request>>>) {
    loop {
        let Some(request) = read_request(&mut stream).await else {
            return;
        };
        // Recorded before it is answered: a client that exits on the answer (a function
        // reporting its init error) is never seen to have sent nothing.
        let reply = {
            let mut all = seen.lock().expect("requests");
            // A request to a vendor's endpoint is judged as the vendor's API judges it first.
            let refused = crate::support::providers::vendor_refuses(&request);
            let reply = refused.unwrap_or_else(|| route(&request, &all));
            all.push(request.clone());
            reply
        };
        let keep = write_reply(&mut stream, reply, &request).await;
        if !keep {
            return;
        }
    }
}

async fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path) = (first.next()?.to_owned(), first.next()?.to_owned());
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Request {
        method,
        path,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
        raw: body,
    })
}

/// Writes the reply; false when the connection is to be closed.
async fn write_reply(stream: &mut TcpStream, reply: Reply, request: &Request) -> bool {
    match reply {
        Reply::Drop => false,
        Reply::Events { parts, stall } => {
            let parts = parts
                .into_iter()
                .map(|(p, t)| (p, t.into_bytes()))
                .collect();
            let reply = Reply::Bytes {
                content_type: "text/event-stream",
                parts,
                stall,
            };
            Box::pin(write_reply(stream, reply, request)).await
        }
        Reply::Bytes {
            content_type,
            parts,
            stall,
        } => {
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n"
            );
            if stream.write_all(head.as_bytes()).await.is_err() {
                return false;
            }
            for (pause, bytes) in parts {
                tokio::time::sleep(pause).await;
                let mut chunk = format!("{:x}\r\n", bytes.len()).into_bytes();
                chunk.extend_from_slice(&bytes);
                chunk.extend_from_slice(b"\r\n");
                if stream.write_all(&chunk).await.is_err() {
                    return false;
                }
            }
            if stall {
                tokio::time::sleep(Duration::from_secs(3_600)).await;
                return false;
            }
            stream.write_all(b"0\r\n\r\n").await.is_ok()
        }
        Reply::Cut { status, body, sent } => {
            let head = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            let mut bytes = head.into_bytes();
            bytes.extend_from_slice(&body.as_bytes()[..sent.min(body.len())]);
            let _ = stream.write_all(&bytes).await;
            false
        }
        Reply::Slow(pause, reply) => {
            tokio::time::sleep(pause).await;
            Box::pin(write_reply(stream, *reply, request)).await
        }
        Reply::When(condition, limit, reply) => {
            let until = tokio::time::Instant::now() + limit;
            while !(condition.0)() && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Box::pin(write_reply(stream, *reply, request)).await
        }
        Reply::Forward(base) => {
            // One upstream connection per request, closed by the upstream after its answer:
            // the bytes are relayed as they are, whatever their framing, and the client's
            // connection is closed after them.
            let Some(authority) = base.strip_prefix("http://") else {
                return false;
            };
            let Ok(mut upstream) = TcpStream::connect(authority).await else {
                return false;
            };
            let mut out = format!("{} {} HTTP/1.1\r\n", request.method, request.path);
            for (k, v) in &request.headers {
                if !k.eq_ignore_ascii_case("connection") {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
            }
            out.push_str("connection: close\r\n\r\n");
            out.push_str(&request.body);
            if upstream.write_all(out.as_bytes()).await.is_err() {
                return false;
            }
            let mut answer = Vec::new();
            if upstream.read_to_end(&mut answer).await.is_err() {
                return false;
            }
            // Tell the client this connection ends here, so it never reuses it.
            let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
                return false;
            };
            let head = String::from_utf8_lossy(&answer[..end]);
            let mut relayed: String = head
                .split("\r\n")
                .filter(|line| !line.to_ascii_lowercase().starts_with("connection:"))
                .map(|line| format!("{line}\r\n"))
                .collect();
            relayed.push_str("connection: close\r\n\r\n");
            let mut bytes = relayed.into_bytes();
            bytes.extend_from_slice(&answer[end + 4..]);
            let _ = stream.write_all(&bytes).await;
            false
        }
        Reply::Json {
            status,
            headers,
            body,
        } => {
            let mut out = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
                body.len()
            );
            for (k, v) in headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("\r\n");
            out.push_str(&body);
            stream.write_all(out.as_bytes()).await.is_ok()
        }
    }
}

/// A Bedrock provider whose Converse requests go to `url` (a stub of ours), signed with test
/// credentials; its answers whole.
pub fn bedrock(url: &str) -> fenced_jobs::provider::bedrock::BedrockProvider {
    bedrock_with(url, false)
}

/// [`bedrock`], its answers streamed (`ConverseStream`) when `stream`.
pub fn bedrock_with(url: &str, stream: bool) -> fenced_jobs::provider::bedrock::BedrockProvider {
    let aws = aws_config::SdkConfig::builder()
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::SharedCredentialsProvider::new(
            aws_sdk_dynamodb::config::Credentials::for_tests(),
        ))
        .behavior_version(aws_config::BehaviorVersion::latest())
        .build();
    let settings = fenced_jobs::provider::bedrock::BedrockSettings {
        guardrail: Some(("gr-1".to_owned(), "2".to_owned())),
        model_id: None,
        endpoint_url: Some(url.to_owned()),
        stream,
    };
    fenced_jobs::provider::bedrock::BedrockProvider::new(&aws, &settings)
}
