//! The tests' HTTP/1.1 receiver on 127.0.0.1: records every request and answers it as the
//! test says, or accepts connections and never reads them (a black hole).
//!
//! Shared by the exporters' tests (`#[path]`): `pyroscope_push.rs` and `setup_e2e.rs`.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One request as received.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) path: String,
    /// Names lowercased.
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Request {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body, gunzipped when `Content-Encoding: gzip`.
    pub(crate) fn payload(&self) -> Vec<u8> {
        if self.header("content-encoding") == Some("gzip") {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&self.body[..])
                .read_to_end(&mut out)
                .expect("gzip body");
            out
        } else {
            self.body.clone()
        }
    }
}

/// The answer to one request: status, extra headers, body.
pub(crate) type Answer = (u16, Vec<(&'static str, String)>, Vec<u8>);
pub(crate) type Responder = Box<dyn FnMut(usize, &Request) -> Answer + Send>;

/// A one-thread HTTP/1.1 server: reads `Content-Length` bodies, answers with
/// `Connection: close`. Or a black hole that accepts connections and never reads them.
pub(crate) struct Receiver {
    pub(crate) addr: SocketAddr,
    requests: Arc<Mutex<Vec<Request>>>,
    pub(crate) accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    pub(crate) fn answering(listener: TcpListener, responder: Responder) -> Receiver {
        Receiver::start(listener, Some(responder))
    }

    pub(crate) fn ok(listener: TcpListener) -> Receiver {
        Receiver::answering(listener, Box::new(|_, _| (200, vec![], b"{}".to_vec())))
    }

    pub(crate) fn black_hole(listener: TcpListener) -> Receiver {
        Receiver::start(listener, None)
    }

    /// Answers 200 to every request and keeps none (a soak's stand-in: its memory must
    /// not grow with what it receives); `accepted` still counts them.
    pub(crate) fn discarding(listener: TcpListener) -> Receiver {
        Receiver::start_keeping(
            listener,
            Some(Box::new(|_, _| (200, vec![], b"{}".to_vec()))),
            false,
        )
    }

    pub(crate) fn start(listener: TcpListener, responder: Option<Responder>) -> Receiver {
        Receiver::start_keeping(listener, responder, true)
    }

    fn start_keeping(
        listener: TcpListener,
        mut responder: Option<Responder>,
        keep: bool,
    ) -> Receiver {
        let addr = listener.local_addr().expect("addr");
        listener.set_nonblocking(true).expect("nonblocking");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, a, s) = (requests.clone(), accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !s.load(Ordering::SeqCst) {
                let stream = match listener.accept() {
                    Ok((stream, _)) => stream,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                    Err(e) => panic!("accept: {e}"),
                };
                a.fetch_add(1, Ordering::SeqCst);
                match responder.as_mut() {
                    None => held.push(stream),
                    Some(responder) => {
                        let _ = serve(stream, &r, responder);
                        if !keep {
                            r.lock().expect("requests").clear();
                        }
                    }
                }
            }
        });
        Receiver {
            addr,
            requests,
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn requests(&self) -> Vec<Request> {
        self.requests.lock().expect("requests").clone()
    }

    pub(crate) fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Request> {
        let until = Instant::now() + timeout;
        loop {
            let got = self.requests();
            if got.len() >= n || Instant::now() >= until {
                return got;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request from `stream`, records it and writes the answer.
fn serve(
    stream: TcpStream,
    requests: &Mutex<Vec<Request>>,
    responder: &mut Responder,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').expect("header line");
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map(|(_, v)| v.parse().expect("content-length"))
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let request = Request {
        method,
        path,
        headers,
        body,
    };
    let index = {
        let mut all = requests.lock().expect("requests");
        all.push(request.clone());
        all.len() - 1
    };
    let (status, extra, body) = responder(index, &request);
    let mut out = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in extra {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    let mut stream = stream;
    stream.write_all(out.as_bytes())?;
    stream.write_all(&body)?;
    stream.flush()?;
    let _ = stream.shutdown(std::net::Shutdown::Both);
    Ok(())
}

/// A port nothing listens on (bound, then released).
pub(crate) fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// Listens on `addr` again (a port released by [`closed_port`]).
pub(crate) fn rebind(addr: SocketAddr) -> TcpListener {
    for _ in 0..100 {
        if let Ok(listener) = TcpListener::bind(addr) {
            return listener;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("cannot listen on {addr} again");
}

pub(crate) fn fresh_listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").expect("bind")
}
