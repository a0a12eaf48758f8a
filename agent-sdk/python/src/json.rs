//! The JSON of the one native call (`Client.call`): a request's fields written from the
//! Python objects that hold them, and a reply read into Python objects, both here so
//! that the Python layer neither writes nor parses JSON text on its way to the wire.
//!
//! A request is a `dict` of the op's fields (PROTOCOL.md §5), written as the wire
//! writes them: nested `dict`s, `list`s and `tuple`s, `str`, `int`, `float` and `bool`;
//! a field whose value is `None` is left out (the protocol reads a number or string
//! left out as absent, and refuses `null` for others). Two kinds of value are JSON
//! values rather than fields: `bytes`, JSON text the caller checked to be one UTF-8
//! JSON value, spliced in as it is; and a [`Json`], any Python value written exactly as
//! `json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)`
//! writes it (its `None` is `null`), the common types here and anything else by that
//! call itself.
//!
//! A reply frame's JSON object is read by CPython's own JSON decoder (`json.loads`'s),
//! so numbers, strings and key order come back exactly as `json.loads` gives them.

use std::io::Write;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::errors::invalid;

/// Containers nested deeper than this inside a [`Json`] are written by `json.dumps`
/// (which finds a cycle, where this writer would recurse forever).
const MAX_DEPTH: usize = 64;

/// A JSON value of a request (a payload, a result, a checkpoint, a searched value):
/// written as `json.dumps` writes it; when it cannot be, `InvalidInput` says
/// "`what` is not JSON-serialisable: ...".
#[pyclass(frozen, module = "muster._native")]
pub struct Json {
    value: Py<PyAny>,
    what: Py<PyString>,
}

#[pymethods]
impl Json {
    #[new]
    fn new(value: Py<PyAny>, what: Py<PyString>) -> Json {
        Json { value, what }
    }
}

/// A request's fields (a `dict`) as the JSON text of an object.
pub fn request(fields: &Bound<'_, PyAny>) -> PyResult<String> {
    let dict = fields.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!(
            "a request is a dict of its fields, not {}",
            type_name(fields)
        ))
    })?;
    let mut out = Vec::with_capacity(128);
    write_fields(&mut out, dict)?;
    // Every piece written is UTF-8: Python's `str`s encoded, bytes checked.
    String::from_utf8(out).map_err(|e| invalid(format!("a request is not UTF-8: {e}")))
}

fn write_fields(out: &mut Vec<u8>, dict: &Bound<'_, PyDict>) -> PyResult<()> {
    out.push(b'{');
    let mut first = true;
    for (key, value) in dict.iter() {
        if value.is_none() {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        let key = key.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!("a field's name is a str, not {}", type_name(&key)))
        })?;
        write_str(out, key)?;
        out.push(b':');
        write_field(out, &value)?;
    }
    out.push(b'}');
    Ok(())
}

fn write_field(out: &mut Vec<u8>, value: &Bound<'_, PyAny>) -> PyResult<()> {
    if let Ok(dict) = value.cast_exact::<PyDict>() {
        write_fields(out, dict)
    } else if let Ok(json) = value.cast_exact::<Json>() {
        let json = json.get();
        write_value(
            out,
            json.value.bind(value.py()),
            json.what.bind(value.py()),
            0,
        )
    } else if let Ok(bytes) = value.cast_exact::<PyBytes>() {
        splice(out, bytes.as_bytes())
    } else if value.is_exact_instance_of::<PyList>() || value.is_exact_instance_of::<PyTuple>() {
        out.push(b'[');
        for (n, item) in value.try_iter()?.enumerate() {
            if n > 0 {
                out.push(b',');
            }
            write_field(out, &item?)?;
        }
        out.push(b']');
        Ok(())
    } else if value.is_none() {
        out.extend_from_slice(b"null");
        Ok(())
    } else if write_scalar(out, value)? {
        Ok(())
    } else {
        // An int subclass (an IntEnum, say), a str subclass: as json.dumps writes it,
        // and its error as json.dumps raises it.
        out.extend_from_slice(dumps(value)?.encode_utf8()?.as_bytes());
        Ok(())
    }
}

/// A JSON value of a [`Json`], as `json.dumps` writes it.
fn write_value(
    out: &mut Vec<u8>,
    value: &Bound<'_, PyAny>,
    what: &Bound<'_, PyString>,
    depth: usize,
) -> PyResult<()> {
    if depth < MAX_DEPTH {
        if let Ok(dict) = value.cast_exact::<PyDict>() {
            let start = out.len();
            out.push(b'{');
            for (n, (key, item)) in dict.iter().enumerate() {
                let Ok(key) = key.cast_exact::<PyString>() else {
                    // json.dumps turns numbers, booleans and None into keys, and
                    // refuses the rest: the whole dict goes to it.
                    out.truncate(start);
                    return write_dumped(out, value, what);
                };
                if n > 0 {
                    out.push(b',');
                }
                write_str(out, key)?;
                out.push(b':');
                write_value(out, &item, what, depth + 1)?;
            }
            out.push(b'}');
            return Ok(());
        }
        if value.is_exact_instance_of::<PyList>() || value.is_exact_instance_of::<PyTuple>() {
            out.push(b'[');
            for (n, item) in value.try_iter()?.enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                write_value(out, &item?, what, depth + 1)?;
            }
            out.push(b']');
            return Ok(());
        }
    }
    if value.is_none() {
        out.extend_from_slice(b"null");
        return Ok(());
    }
    if write_scalar(out, value)? {
        return Ok(());
    }
    write_dumped(out, value, what)
}

/// Writes an exact `str`, `bool`, `int` (within i64) or finite `float` as json.dumps
/// does; false (nothing written) for anything else.
fn write_scalar(out: &mut Vec<u8>, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    if let Ok(s) = value.cast_exact::<PyString>() {
        write_str(out, s)?;
    } else if let Ok(b) = value.cast_exact::<PyBool>() {
        out.extend_from_slice(if b.is_true() { b"true" } else { b"false" });
    } else if let Ok(i) = value.cast_exact::<PyInt>() {
        let Ok(n) = i.extract::<i64>() else {
            return Ok(false);
        };
        write!(out, "{n}")?;
    } else if let Ok(f) = value.cast_exact::<PyFloat>() {
        if !f.value().is_finite() {
            return Ok(false);
        }
        // json.dumps writes a float as float.__repr__ does.
        out.extend_from_slice(f.repr()?.encode_utf8()?.as_bytes());
    } else {
        return Ok(false);
    }
    Ok(true)
}

/// `value` through json.dumps itself, its refusal an `InvalidInput` naming `what`.
fn write_dumped(
    out: &mut Vec<u8>,
    value: &Bound<'_, PyAny>,
    what: &Bound<'_, PyString>,
) -> PyResult<()> {
    let py = value.py();
    match dumps(value) {
        Ok(text) => {
            out.extend_from_slice(text.encode_utf8()?.as_bytes());
            Ok(())
        }
        Err(e) if e.is_instance_of::<PyTypeError>(py) || e.is_instance_of::<PyValueError>(py) => {
            Err(invalid(format!(
                "{what} is not JSON-serialisable: {}",
                e.value(py)
            )))
        }
        Err(e) => Err(e),
    }
}

/// `json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)`.
fn dumps<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    static ENCODE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let py = value.py();
    let encode = ENCODE.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        let kwargs = PyDict::new(py);
        kwargs.set_item("separators", (",", ":"))?;
        kwargs.set_item("ensure_ascii", false)?;
        kwargs.set_item("allow_nan", false)?;
        let encoder = py
            .import("json")?
            .getattr("JSONEncoder")?
            .call((), Some(&kwargs))?;
        Ok(encoder.getattr("encode")?.unbind())
    })?;
    Ok(encode.bind(py).call1((value,))?.cast_into::<PyString>()?)
}

/// JSON text the caller checked to be one JSON value, written as it is.
fn splice(out: &mut Vec<u8>, text: &[u8]) -> PyResult<()> {
    std::str::from_utf8(text).map_err(|e| invalid(format!("JSON text is not UTF-8: {e}")))?;
    out.extend_from_slice(text);
    Ok(())
}

/// A string as json.dumps writes it with `ensure_ascii=False`: `"` and `\` escaped,
/// control characters as `\b \f \n \r \t` or `\u00XX`, everything else as it is.
fn write_str(out: &mut Vec<u8>, s: &Bound<'_, PyString>) -> PyResult<()> {
    let utf8 = s.encode_utf8()?;
    let bytes = utf8.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut run = 0;
    for (at, &b) in bytes.iter().enumerate() {
        let escaped: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[run..at]);
        if escaped.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(escaped);
        }
        run = at + 1;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
    Ok(())
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}

/// A reply frame's JSON object as a Python `dict`, as `json.loads` reads it.
pub fn reply<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    static DECODE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let decode = DECODE.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        let decoder = py.import("json")?.getattr("JSONDecoder")?.call0()?;
        Ok(decoder.getattr("raw_decode")?.unbind())
    })?;
    // raw_decode: (the value, where it ended); the text is exactly one object.
    decode.bind(py).call1((text,))?.get_item(0)
}
