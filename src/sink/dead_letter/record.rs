//! One dead-letter record as a reader sees it, whichever sink's queue it was read from (Kafka by
//! [`crate::tools::dlq`]'s reader, the others by the `dlq` module in their sink's folder), and
//! the undoing of what made the copy writable: headers moved into the body ([`moved`]) and
//! escaped names and keys ([`escape`]). A record is restored once, before it is used; a part that
//! does not decode is named, never guessed.

use super::chunk::Piece;
use super::{H_ERROR, H_PAYLOAD_DROPPED, H_SIZE, H_TOPIC};
use crate::sink::{escape, moved};

/// The header a copy keeps its event's id in.
const H_ID: &str = "id";

/// One DLQ record as read back.
pub struct DlqRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// Length of the payload as read (`list` drops the payload itself).
    pub payload_len: Option<usize>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The record's CreateTime, kept on replay.
    pub timestamp_ms: Option<i64>,
    /// CreateTime or LogAppendTime, whichever the topic keeps (`shadow compare`).
    pub time_ms: Option<i64>,
    /// How [`DlqRecord::position`] shows it when `partition/offset` would not mean anything to the
    /// reader (a Redis entry id); `None` for Kafka and NATS.
    pub label: Option<String>,
    /// The escaped entries [`DlqRecord::restore_escaped`] could not decode, by name. Kept apart
    /// because a restored header may itself be named like an escaped one (a row's own header).
    pub undecoded: Vec<String>,
    /// A chunk of a copy whose headers partly moved into its body ([`crate::sink::moved`]): it is
    /// restored once its chunks are joined ([`DlqRecord::restore`]), not record by record.
    pub moved_later: bool,
}

impl DlqRecord {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v.as_deref().unwrap_or_default()).into_owned())
    }

    pub fn reason(&self) -> String {
        self.header(H_ERROR).unwrap_or_else(|| "unknown".into())
    }

    pub fn event_id(&self) -> Option<String> {
        self.header(H_ID)
    }

    pub fn original_topic(&self) -> Option<String> {
        self.header(H_TOPIC).filter(|t| !t.is_empty())
    }

    /// A copy without its payload: from before chunking existed (too large to keep), or one
    /// whose payload could not be masked.
    pub fn payload_not_kept(&self) -> bool {
        self.payload.is_none() && (self.header(H_SIZE).is_some() || self.header(H_PAYLOAD_DROPPED).is_some())
    }

    pub fn position(&self) -> String {
        if let Some(l) = &self.label {
            return l.clone();
        }
        format!("{}/{}", self.partition, self.offset)
    }

    pub fn id_shown(&self) -> String {
        self.event_id().unwrap_or_else(|| "-".into())
    }

    /// Undo what made the copy writable: headers moved into the body ([`moved::restore`]) back in
    /// their places, then [`DlqRecord::restore_escaped`]. A section that does not decode is named
    /// in [`DlqRecord::undecoded`].
    pub fn restore(&mut self) {
        self.moved_later = false;
        match moved::restore(&mut self.headers, &mut self.key, &mut self.payload) {
            Ok(moved) => {
                if moved {
                    self.payload_len = self.payload.as_ref().map(Vec::len);
                }
                self.restore_escaped();
            }
            Err(why) => self.undecoded.push(format!("{} ({why})", moved::H_MOVED)),
        }
    }

    /// Undo what made the copy writable ([`crate::sink::escape`]): each escaped header back to
    /// its name and bytes, in its place, and an escaped key back to the key. An entry that does
    /// not decode stays as it is and is named in [`DlqRecord::undecoded`]. Names are looked at
    /// once, before anything is restored: a restored header named like an escaped one (the row's
    /// own) is the original, not something left to decode.
    pub fn restore_escaped(&mut self) {
        for (name, value) in self.headers.iter_mut() {
            if name == escape::H_ESCAPED_KEY {
                if self.key.is_none() {
                    self.key = value.take().map(|v| escape::unescape_key(&v));
                }
            } else if escape::is_escaped(name) {
                match value.as_deref().and_then(escape::unescape_header) {
                    Some((n, v)) => {
                        *name = n;
                        *value = Some(v);
                    }
                    None => self.undecoded.push(name.clone()),
                }
            }
        }
        self.headers.retain(|(n, v)| !(n == escape::H_ESCAPED_KEY && v.is_none()));
    }

    /// An escaped entry [`DlqRecord::restore_escaped`] could not decode, if any.
    pub fn escape_left(&self) -> Option<&str> {
        self.undecoded.first().map(String::as_str)
    }
}

impl Piece for DlqRecord {
    fn data_len(&self) -> usize {
        self.payload.as_ref().map_or(0, Vec::len)
    }

    fn strip(&mut self) {
        self.payload = None;
    }
}
