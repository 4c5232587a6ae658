//! A tiny RESP2 client over a raw TCP socket, for readiness probes and cluster setup.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The reply as text, for simple strings and bulk strings; errors become `Err`.
    pub(crate) fn into_text(self) -> io::Result<String> {
        match self {
            Reply::Simple(text) => Ok(text),
            Reply::Bulk(Some(bytes)) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            Reply::Bulk(None) => Ok(String::new()),
            Reply::Integer(n) => Ok(n.to_string()),
            Reply::Error(message) => Err(io::Error::other(format!("redis error: {message}"))),
            Reply::Array(_) => Err(io::Error::other("unexpected array reply")),
        }
    }
}

/// Connects to `127.0.0.1:port`, authenticates when `password` is set, sends one command
/// and reads its reply. Every step is bounded by `timeout`.
pub(crate) fn request(
    port: u16,
    password: Option<&str>,
    args: &[&str],
    timeout: Duration,
) -> io::Result<Reply> {
    let mut replies = pipeline(port, password, &[args.to_vec()], timeout)?;
    Ok(replies.pop().unwrap_or(Reply::Array(None)))
}

/// Like [`request`], for many commands written together on one connection (thousands of
/// `CLUSTER SETSLOT`s take milliseconds, not a connection each). Returns their replies in
/// order; a refused `AUTH` is the one reply.
pub(crate) fn pipeline(
    port: u16,
    password: Option<&str>,
    commands: &[Vec<&str>],
    timeout: Duration,
) -> io::Result<Vec<Reply>> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    if let Some(password) = password {
        writer.write_all(&encode(&["AUTH", password]))?;
        let reply = read_reply(&mut reader)?;
        if let Reply::Error(_) = reply {
            return Ok(vec![reply]);
        }
    }
    let mut out = Vec::new();
    for args in commands {
        out.extend(encode(args));
    }
    writer.write_all(&out)?;
    commands.iter().map(|_| read_reply(&mut reader)).collect()
}

fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    if !line.ends_with(b"\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed mid-reply",
        ));
    }
    line.truncate(line.len() - 2);
    Ok(String::from_utf8_lossy(&line).into_owned())
}

fn parse_len(text: &str) -> io::Result<i64> {
    text.parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad length {text:?}")))
}

fn read_reply(reader: &mut impl BufRead) -> io::Result<Reply> {
    let line = read_line(reader)?;
    let (kind, rest) = line.split_at(line.len().min(1));
    match kind {
        "+" => Ok(Reply::Simple(rest.to_owned())),
        "-" => Ok(Reply::Error(rest.to_owned())),
        ":" => Ok(Reply::Integer(parse_len(rest)?)),
        "$" => {
            let len = parse_len(rest)?;
            if len < 0 {
                return Ok(Reply::Bulk(None));
            }
            let len = usize::try_from(len).map_err(io::Error::other)?;
            let mut data = vec![0; len + 2];
            reader.read_exact(&mut data)?;
            data.truncate(len);
            Ok(Reply::Bulk(Some(data)))
        }
        "*" => {
            let len = parse_len(rest)?;
            if len < 0 {
                return Ok(Reply::Array(None));
            }
            let items = (0..len)
                .map(|_| read_reply(reader))
                .collect::<io::Result<Vec<_>>>()?;
            Ok(Reply::Array(Some(items)))
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a RESP reply: {line:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nested_replies() {
        let mut input: &[u8] = b"*3\r\n+OK\r\n$5\r\nhe\r\no\r\n*2\r\n:-7\r\n$-1\r\n-ERR x\r\n";
        let reply = read_reply(&mut input).unwrap();
        assert_eq!(
            reply,
            Reply::Array(Some(vec![
                Reply::Simple("OK".into()),
                Reply::Bulk(Some(b"he\r\no".to_vec())),
                Reply::Array(Some(vec![Reply::Integer(-7), Reply::Bulk(None)])),
            ]))
        );
        assert_eq!(
            read_reply(&mut input).unwrap(),
            Reply::Error("ERR x".into())
        );
        assert!(read_reply(&mut input).is_err());
    }

    #[test]
    fn encodes_bulk_strings() {
        assert_eq!(encode(&["GET", ""]), b"*2\r\n$3\r\nGET\r\n$0\r\n\r\n");
    }
}
