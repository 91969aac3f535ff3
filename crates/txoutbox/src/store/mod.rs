//! The statements, and the typed functions that bind their parameters and decode their rows,
//! one directory per part of the crate; business code calls the functions, never the text.

pub(crate) mod admin;
