//! Agents served over HTTP (feature `server`).
