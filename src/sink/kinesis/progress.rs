//! `outboxd dlq replay --sink kinesis`'s progress file, `<state-dir>/kinesis.<stream name>.json`:
//! per shard of the dead-letter stream, a checkpoint and the sequence numbers done past it (what
//! they mean is [`super::dlq`]'s).
//!
//! Identity: sequence numbers mean something only in the stream they came from, so the file
//! keeps the stream's ARN and creation time (`DescribeStreamSummary`), and a run against another
//! stream, or one deleted and created again under the same name, is refused with one line saying
//! to move the file away. The file is named by the stream's name as Kinesis answers it, so a
//! stream given by name or by ARN maps to the same file. A file without an identity (written
//! before it was kept) is taken as it is and gets one at its next write.
//!
//! Writing: a temporary file of a name no other writer uses, fsync, rename over the file, fsync
//! of the directory (so the rename itself survives a crash).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::Definite;

/// One shard's replay progress.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(super) struct ShardProgress {
    /// Every record up to this sequence number is done.
    pub after: Option<String>,
    /// Records past `after` that are done.
    pub done: BTreeSet<String>,
}

/// Which stream a file's sequence numbers belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Identity {
    pub name: String,
    pub arn: String,
    /// `StreamCreationTimestamp`, in milliseconds since the epoch.
    pub created_ms: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct ProgressFile {
    version: u32,
    stream: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    arn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    created_ms: Option<i64>,
    shards: BTreeMap<String, ShardProgress>,
}

/// Replay's progress file, loaded.
pub(super) struct Progress {
    path: PathBuf,
    stream: Identity,
    pub shards: BTreeMap<String, ShardProgress>,
}

impl Progress {
    pub fn load(dir: &Path, stream: &Identity) -> Result<Progress, Definite> {
        let name = percent_encoding::utf8_percent_encode(&stream.name, FILE_NAME_KEEPS);
        let path = dir.join(format!("kinesis.{name}.json"));
        let moved =
            |why: String| Definite::Config(format!("{}: {why}; move it away to replay from the start", path.display()));
        let shards = match std::fs::read(&path) {
            Ok(b) => {
                let f: ProgressFile = serde_json::from_slice(&b)
                    .map_err(|e| moved(format!("not a Kinesis replay progress file ({e})")))?;
                if f.version != 1 || f.stream != stream.name {
                    return Err(moved(format!(
                        "version {} for stream {:?}, not version 1 for {:?}",
                        f.version, f.stream, stream.name
                    )));
                }
                let same = f.arn.as_deref().is_none_or(|a| a == stream.arn)
                    && f.created_ms.is_none_or(|c| c == stream.created_ms);
                if !same {
                    return Err(moved(format!(
                        "progress of stream {} created at {} ms, but {} now is the one created at {} ms",
                        f.arn.unwrap_or_default(),
                        f.created_ms.unwrap_or_default(),
                        stream.arn,
                        stream.created_ms
                    )));
                }
                f.shards
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(Definite::Config(format!("cannot read {}: {e}", path.display()))),
        };
        Ok(Progress { path, stream: stream.clone(), shards })
    }

    pub fn save(&self) -> Result<(), Definite> {
        let f = ProgressFile {
            version: 1,
            stream: self.stream.name.clone(),
            arn: Some(self.stream.arn.clone()),
            created_ms: Some(self.stream.created_ms),
            shards: self.shards.clone(),
        };
        // Unique: this process's id and a per-process count.
        static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self.path.with_extension(format!("json.{}.{n}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            let dir = self.path.parent().unwrap_or(Path::new("."));
            std::fs::create_dir_all(dir)?;
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&serde_json::to_vec(&f).unwrap_or_default())?;
            file.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            std::fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Definite::Config(format!("cannot write {}: {e}", self.path.display()))
        })
    }
}

/// What a replay state's file name keeps of a stream name as it is; the rest is percent-encoded.
const FILE_NAME_KEEPS: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'.').remove(b'-').remove(b'_');

#[cfg(test)]
mod tests {
    use super::*;

    fn id(arn: &str, created_ms: i64) -> Identity {
        Identity { name: "dlq".into(), arn: arn.into(), created_ms }
    }

    #[test]
    fn a_file_of_another_stream_of_the_same_name_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = id("arn:aws:kinesis:us-east-1:1:stream/dlq", 1000);
        let mut p = Progress::load(dir.path(), &first).expect("no file");
        p.shards.insert("shardId-0".into(), ShardProgress { after: Some("7".into()), done: BTreeSet::new() });
        p.save().expect("save");
        assert!(dir.path().join("kinesis.dlq.json").exists());
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1, "a temporary file was left");
        assert_eq!(Progress::load(dir.path(), &first).expect("same stream").shards, p.shards);
        for other in
            [id("arn:aws:kinesis:us-east-1:1:stream/dlq", 2000), id("arn:aws:kinesis:eu-west-1:1:stream/dlq", 1000)]
        {
            let e = Progress::load(dir.path(), &other).err().expect("refused").to_string();
            assert!(e.contains("move it away") && !e.contains('\n'), "{e}");
        }
        // A file written before the identity was kept is taken.
        std::fs::write(dir.path().join("kinesis.dlq.json"), br#"{"version":1,"stream":"dlq","shards":{}}"#)
            .expect("write");
        assert!(Progress::load(dir.path(), &first).is_ok());
    }
}
