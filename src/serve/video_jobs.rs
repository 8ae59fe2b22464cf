//! The server's video jobs: a plain, bounded table the HTTP side owns. A job is
//! queued, in progress (its model's thread took it), completed (its MP4 kept here)
//! or failed (its error kept). The model's thread never touches the table: it sets the
//! job's [`JobProgress`] and sends its one answer, which the HTTP side files here.
//!
//! Bounds: at most `limits.max_video_jobs` jobs of every state together (a new one
//! drops the oldest finished one; with none finished to drop it is refused, 429), and
//! at most `limits.max_video_bytes` of kept MP4s (past it the oldest finished jobs are
//! dropped; an MP4 larger than the whole allowance fails its job instead).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use serde::Serialize;

use crate::run::loaded::Cancel;

/// How far a job is, written by the model's thread and read by the table.
#[derive(Debug, Default)]
pub struct JobProgress {
    started: AtomicBool,
    percent: AtomicU8,
}

impl JobProgress {
    /// The model's thread took the job.
    pub fn start(&self) {
        self.started.store(true, Ordering::SeqCst);
    }

    /// `percent` done, 0 to 100 (never going back).
    pub fn set(&self, percent: u8) {
        self.percent.fetch_max(percent.min(100), Ordering::SeqCst);
    }

    fn read(&self) -> (bool, u8) {
        (
            self.started.load(Ordering::SeqCst),
            self.percent.load(Ordering::SeqCst),
        )
    }
}

/// Why a job failed, as OpenAI's `error` of a video says it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobError {
    pub code: &'static str,
    pub message: String,
}

#[derive(Debug, Clone)]
enum JobState {
    Waiting,
    Completed { mp4: Bytes, completed_at: u64 },
    Failed { error: JobError, completed_at: u64 },
}

/// A new job as its handler describes it.
#[derive(Debug)]
pub struct NewJob {
    pub id: String,
    pub model: String,
    pub prompt: String,
    pub size: String,
    pub seconds: String,
    pub created_at: u64,
    pub progress: Arc<JobProgress>,
    pub cancel: Cancel,
}

/// OpenAI's video object: what `GET /v1/videos/{id}` answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VideoObject {
    pub id: String,
    pub object: &'static str,
    pub model: String,
    pub status: &'static str,
    pub progress: u8,
    pub created_at: u64,
    pub completed_at: Option<u64>,
    pub expires_at: Option<u64>,
    pub prompt: String,
    pub size: String,
    pub seconds: String,
    pub remixed_from_video_id: Option<String>,
    pub error: Option<JobError>,
}

/// Why `content` has no MP4 to give.
#[derive(Debug, Clone, PartialEq)]
pub enum NoContent {
    /// No job of that id (never made, deleted, or dropped by the bounds).
    Unknown,
    /// The job has not finished: its status.
    NotReady(&'static str),
    /// The job failed.
    Failed(JobError),
}

/// The table was full of unfinished jobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TableFull {
    pub jobs: usize,
}

#[derive(Debug)]
struct Entry {
    job: NewJob,
    state: JobState,
}

impl Entry {
    fn finished(&self) -> bool {
        !matches!(self.state, JobState::Waiting)
    }

    fn bytes(&self) -> usize {
        match &self.state {
            JobState::Completed { mp4, .. } => mp4.len(),
            _ => 0,
        }
    }

    fn object(&self) -> VideoObject {
        let (started, percent) = self.job.progress.read();
        let (status, progress, completed_at, error) = match &self.state {
            JobState::Waiting if started => ("in_progress", percent.min(99), None, None),
            JobState::Waiting => ("queued", 0, None, None),
            JobState::Completed { completed_at, .. } => {
                ("completed", 100, Some(*completed_at), None)
            }
            JobState::Failed {
                error,
                completed_at,
            } => ("failed", percent, Some(*completed_at), Some(error.clone())),
        };
        VideoObject {
            id: self.job.id.clone(),
            object: "video",
            model: self.job.model.clone(),
            status,
            progress,
            created_at: self.job.created_at,
            completed_at,
            expires_at: None,
            prompt: self.job.prompt.clone(),
            size: self.job.size.clone(),
            seconds: self.job.seconds.clone(),
            remixed_from_video_id: None,
            error,
        }
    }
}

/// The jobs, oldest first.
#[derive(Debug)]
pub struct VideoJobs {
    entries: VecDeque<Entry>,
    max_jobs: usize,
    max_bytes: usize,
    kept_bytes: usize,
}

impl VideoJobs {
    pub fn new(max_jobs: usize, max_bytes: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            max_jobs,
            max_bytes,
            kept_bytes: 0,
        }
    }

    /// Files `job` as queued, dropping the oldest finished job when the table is full;
    /// refused when every job in it is unfinished.
    pub fn insert(&mut self, job: NewJob) -> Result<VideoObject, TableFull> {
        if self.entries.len() >= self.max_jobs && !self.drop_oldest_finished(None) {
            return Err(TableFull {
                jobs: self.entries.len(),
            });
        }
        let entry = Entry {
            job,
            state: JobState::Waiting,
        };
        let object = entry.object();
        self.entries.push_back(entry);
        Ok(object)
    }

    /// Files a job's answer (the MP4, or why not); a job deleted meanwhile is gone and
    /// its answer dropped.
    pub fn finish(&mut self, id: &str, answer: Result<Bytes, JobError>, now: u64) {
        let max_bytes = self.max_bytes;
        let Some(entry) = self.entries.iter_mut().find(|entry| entry.job.id == id) else {
            return;
        };
        entry.state = match answer {
            Ok(mp4) if mp4.len() > max_bytes => JobState::Failed {
                error: JobError {
                    code: "video_too_large",
                    message: format!("the MP4 is {} bytes, above limits.max_video_bytes = {max_bytes}; ask for fewer frames or a smaller size", mp4.len()),
                },
                completed_at: now,
            },
            Ok(mp4) => JobState::Completed { mp4, completed_at: now },
            Err(error) => JobState::Failed { error, completed_at: now },
        };
        self.kept_bytes += entry.bytes();
        // The job just finished stays: its MP4 alone fits the allowance.
        while self.kept_bytes > self.max_bytes && self.drop_oldest_finished(Some(id)) {}
    }

    /// Drops the oldest finished job other than `keep`; whether there was one.
    fn drop_oldest_finished(&mut self, keep: Option<&str>) -> bool {
        let droppable = |entry: &Entry| entry.finished() && Some(entry.job.id.as_str()) != keep;
        let Some(at) = self.entries.iter().position(droppable) else {
            return false;
        };
        if let Some(entry) = self.entries.remove(at) {
            self.kept_bytes -= entry.bytes();
        }
        true
    }

    pub fn get(&self, id: &str) -> Option<VideoObject> {
        self.entry(id).map(Entry::object)
    }

    fn entry(&self, id: &str) -> Option<&Entry> {
        self.entries.iter().find(|entry| entry.job.id == id)
    }

    /// The MP4 of a completed job.
    pub fn content(&self, id: &str) -> Result<Bytes, NoContent> {
        let entry = self.entry(id).ok_or(NoContent::Unknown)?;
        match &entry.state {
            JobState::Completed { mp4, .. } => Ok(mp4.clone()),
            JobState::Failed { error, .. } => Err(NoContent::Failed(error.clone())),
            JobState::Waiting => Err(NoContent::NotReady(entry.object().status)),
        }
    }

    /// Removes a job, cancelling it when it has not finished (its model's thread skips
    /// it, or stops it at its next step); `None` when there is none of that id.
    pub fn remove(&mut self, id: &str) -> Option<VideoObject> {
        let at = self.entries.iter().position(|entry| entry.job.id == id)?;
        let entry = self.entries.remove(at)?;
        entry.job.cancel.cancel();
        self.kept_bytes -= entry.bytes();
        Some(entry.object())
    }

    /// Up to `limit` jobs after the job `after` (exclusive), oldest first when
    /// `ascending`, else newest first.
    pub fn list(
        &self,
        after: Option<&str>,
        limit: usize,
        ascending: bool,
    ) -> (Vec<VideoObject>, bool) {
        let ordered: Vec<&Entry> = if ascending {
            self.entries.iter().collect()
        } else {
            self.entries.iter().rev().collect()
        };
        let start = after
            .and_then(|id| ordered.iter().position(|entry| entry.job.id == id))
            .map_or(0, |at| at + 1);
        let rest = &ordered[start.min(ordered.len())..];
        let page = rest
            .iter()
            .take(limit)
            .map(|entry| entry.object())
            .collect();
        (page, rest.len() > limit)
    }

    /// Bytes of MP4s kept now.
    #[cfg(test)]
    fn kept_bytes(&self) -> usize {
        self.kept_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str) -> NewJob {
        NewJob {
            id: id.into(),
            model: "wan".into(),
            prompt: "a fox".into(),
            size: "48x64".into(),
            seconds: "0.25".into(),
            created_at: 1,
            progress: Arc::default(),
            cancel: Cancel::new(),
        }
    }

    #[test]
    fn a_job_goes_queued_in_progress_completed_and_its_mp4_is_kept() {
        // Proves the states a client polls, the progress it reads, and the content
        // only once completed.
        let mut jobs = VideoJobs::new(4, 1000);
        let new = job("a");
        let progress = Arc::clone(&new.progress);
        assert_eq!(jobs.insert(new).expect("room").status, "queued");
        assert_eq!(jobs.content("a"), Err(NoContent::NotReady("queued")));
        progress.start();
        progress.set(40);
        let object = jobs.get("a").expect("filed");
        assert_eq!((object.status, object.progress), ("in_progress", 40));
        jobs.finish("a", Ok(Bytes::from_static(b"mp4")), 9);
        let object = jobs.get("a").expect("filed");
        assert_eq!((object.status, object.progress), ("completed", 100));
        assert_eq!(object.completed_at, Some(9));
        assert_eq!(jobs.content("a"), Ok(Bytes::from_static(b"mp4")));
        assert_eq!(jobs.content("b"), Err(NoContent::Unknown));
    }

    #[test]
    fn the_table_keeps_its_bounds_dropping_the_oldest_finished_first() {
        // Proves both bounds: a full table of unfinished jobs refuses, one with a
        // finished job drops it; kept bytes past the allowance drop the oldest
        // finished; an MP4 above the whole allowance fails its job.
        let mut jobs = VideoJobs::new(2, 10);
        jobs.insert(job("a")).expect("room");
        jobs.insert(job("b")).expect("room");
        assert_eq!(jobs.insert(job("c")), Err(TableFull { jobs: 2 }));
        jobs.finish("b", Ok(Bytes::from_static(b"123456")), 2);
        jobs.insert(job("c")).expect("b dropped");
        assert_eq!(jobs.get("b"), None);
        jobs.finish("a", Ok(Bytes::from_static(b"123456")), 3);
        jobs.finish("c", Ok(Bytes::from_static(b"123456")), 4);
        assert_eq!(jobs.get("a"), None, "12 bytes kept is past 10: a goes");
        assert_eq!(jobs.kept_bytes(), 6);
        jobs.insert(job("d")).expect("room");
        jobs.finish("d", Ok(Bytes::from(vec![0; 11])), 5);
        let error = jobs
            .get("d")
            .and_then(|object| object.error)
            .expect("failed");
        assert_eq!(error.code, "video_too_large");
    }

    #[test]
    fn removing_a_job_cancels_it_and_frees_its_bytes() {
        // Proves DELETE's effect: the job's cancel flag is set (its thread skips or
        // stops it), its answer arriving later is dropped, its bytes are freed.
        let mut jobs = VideoJobs::new(4, 100);
        let new = job("a");
        let cancel = new.cancel.clone();
        jobs.insert(new).expect("room");
        assert!(jobs.remove("a").is_some());
        assert!(cancel.is_cancelled());
        jobs.finish("a", Ok(Bytes::from_static(b"late")), 2);
        assert_eq!((jobs.get("a"), jobs.kept_bytes()), (None, 0));
        jobs.insert(job("b")).expect("room");
        jobs.finish("b", Ok(Bytes::from_static(b"mp4")), 3);
        jobs.remove("b");
        assert_eq!(jobs.kept_bytes(), 0);
        assert!(jobs.remove("b").is_none());
    }

    #[test]
    fn a_list_pages_after_an_id_in_either_order() {
        // Proves `after`, `limit` and `order` as OpenAI's list takes them.
        let mut jobs = VideoJobs::new(8, 100);
        for id in ["a", "b", "c"] {
            jobs.insert(job(id)).expect("room");
        }
        let ids = |(page, more): (Vec<VideoObject>, bool)| {
            (
                page.into_iter().map(|object| object.id).collect::<Vec<_>>(),
                more,
            )
        };
        assert_eq!(
            ids(jobs.list(None, 2, false)),
            (vec!["c".into(), "b".into()], true)
        );
        assert_eq!(
            ids(jobs.list(Some("b"), 2, false)),
            (vec!["a".into()], false)
        );
        assert_eq!(
            ids(jobs.list(Some("a"), 5, true)),
            (vec!["b".into(), "c".into()], false)
        );
    }
}
