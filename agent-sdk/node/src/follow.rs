//! `Follower`: a task's output followed to its end (see `muster_sdk::Follower`).
