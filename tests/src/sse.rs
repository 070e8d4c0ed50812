//! A server-sent events reader for tests: one HTTP/1.1 `GET` on a connection of its own, read
//! on a thread of its own (the chunked body decoded, each message parsed), its events handed
//! over as they come. The connection breaking — its server killed — ends the stream.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::Duration;

/// One message of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// Its `id:`, if it has one.
    pub id: Option<String>,
    /// Its `event:` (`message` if none).
    pub name: String,
    pub data: String,
}

/// An open stream.
pub struct SseStream {
    events: mpsc::Receiver<SseEvent>,
    /// The status the server answered with.
    pub status: u16,
}

impl SseStream {
    /// `GET path` on `addr` with the bearer `token` and, if given, `Last-Event-ID`; returns once
    /// the answer's head is read.
    pub fn open(addr: &str, path: &str, token: &str, last_event_id: Option<&str>) -> SseStream {
        let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        let resume = last_event_id.map(|id| format!("last-event-id: {id}\r\n")).unwrap_or_default();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\naccept: text/event-stream\r\n{resume}\r\n"
        )
        .expect("send the request");
        let mut reader = BufReader::new(stream);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || read_events(reader, chunked, tx));
        SseStream { events, status }
    }

    /// The next event within `wait`; `None` if none came or the stream ended.
    pub fn next(&self, wait: Duration) -> Option<SseEvent> {
        self.events.recv_timeout(wait).ok()
    }
}

/// Decodes the body (chunked or not), splits it into messages, sends each; ends with the
/// connection.
fn read_events(mut reader: BufReader<TcpStream>, chunked: bool, tx: mpsc::Sender<SseEvent>) {
    let mut text: Vec<u8> = Vec::new();
    loop {
        let mut bytes = Vec::new();
        if chunked {
            let mut size = String::new();
            if reader.read_line(&mut size).unwrap_or(0) == 0 {
                return;
            }
            let Ok(n) = usize::from_str_radix(size.trim(), 16) else { return };
            if n == 0 {
                return;
            }
            bytes.resize(n + 2, 0);
            if reader.read_exact(&mut bytes).is_err() {
                return;
            }
            bytes.truncate(n);
        } else {
            let mut buf = [0u8; 8192];
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
            }
        }
        text.extend_from_slice(&bytes);
        while let Some(end) = text.windows(2).position(|w| w == b"\n\n") {
            let message: Vec<u8> = text.drain(..end + 2).collect();
            if let Some(event) = parse(&String::from_utf8_lossy(&message))
                && tx.send(event).is_err()
            {
                return;
            }
        }
    }
}

/// One message; `None` for a comment alone (a keep-alive).
fn parse(message: &str) -> Option<SseEvent> {
    let (mut id, mut name, mut data) = (None, None, Vec::new());
    for line in message.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => id = Some(value.to_string()),
            "event" => name = Some(value.to_string()),
            "data" => data.push(value),
            _ => {}
        }
    }
    if name.is_none() && data.is_empty() {
        return None;
    }
    Some(SseEvent {
        id,
        name: name.unwrap_or_else(|| "message".to_string()),
        data: data.join("\n"),
    })
}
