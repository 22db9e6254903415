//! The fixed newstyle handshake: the server's greeting, then options
//! until the client picks an export (NBD_OPT_EXPORT_NAME or NBD_OPT_GO)
//! or leaves. Unknown options get NBD_REP_ERR_UNSUP, malformed ones
//! NBD_REP_ERR_INVALID, and the client may carry on; a bad magic, unknown
//! client flags or oversized option data close the connection. When the
//! server requires TLS, every option but NBD_OPT_STARTTLS and
//! NBD_OPT_ABORT gets NBD_REP_ERR_TLS_REQD (NBD_OPT_EXPORT_NAME, which
//! has no error reply, closes) until the client has started TLS; the
//! options then start over on the TLS session.

use crate::error::NbdError;
use crate::export::{Export, Exports};
use crate::proto::*;
use std::io::{self, Read, Write};
use std::sync::Arc;

/// What the handshake agreed on.
pub(crate) struct Negotiated {
    pub name: String,
    pub export: Arc<dyn Export>,
    pub structured: bool,
    /// base:allocation was selected for this export (block status works).
    pub base_allocation: bool,
}

/// Where the handshake stands with TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsMode {
    /// Not offered (a Unix socket, or plain TCP allowed).
    Off,
    /// Required and not started yet.
    Required,
    /// Started: the options go over TLS.
    Started,
}

/// How the options phase ended.
pub(crate) enum Outcome {
    Go(Negotiated),
    /// The client sent NBD_OPT_STARTTLS and got its ack: the TLS
    /// handshake comes next, then the options start over.
    StartTls,
}

/// Handshake state between options.
struct Options<'a, W> {
    w: &'a mut W,
    exports: &'a dyn Exports,
    tls: TlsMode,
    structured: bool,
    /// The export name and whether base:allocation was selected for it
    /// by the last NBD_OPT_SET_META_CONTEXT.
    meta: Option<(String, bool)>,
}

/// Reads exactly `len` bytes, allocating only as they arrive.
pub(crate) fn read_bounded(r: &mut impl Read, len: u32) -> io::Result<Vec<u8>> {
    let mut v = Vec::new();
    r.take(len as u64).read_to_end(&mut v)?;
    if v.len() < len as usize {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(v)
}

/// The transmission flags of an export.
pub(crate) fn transmission_flags(e: &dyn Export, structured: bool) -> u16 {
    let mut f = TF_HAS_FLAGS | TF_SEND_FLUSH | TF_SEND_FUA | TF_SEND_TRIM;
    f |= TF_SEND_WRITE_ZEROES | TF_SEND_CACHE | TF_CAN_MULTI_CONN;
    if e.read_only() {
        f |= TF_READ_ONLY;
    }
    if structured {
        f |= TF_SEND_DF;
    }
    f
}

/// Runs the handshake on any byte streams and returns the export the
/// client chose (for tools and tests; the server uses it internally).
pub fn negotiate<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    exports: &dyn Exports,
) -> Result<String, NbdError> {
    handshake(r, w, exports).map(|n| n.name)
}

/// Runs the handshake on a fresh connection (without TLS).
pub(crate) fn handshake<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    exports: &dyn Exports,
) -> Result<Negotiated, NbdError> {
    let no_zeroes = greet(r, w)?;
    match options(r, w, exports, no_zeroes, TlsMode::Off)? {
        Outcome::Go(n) => Ok(n),
        Outcome::StartTls => Err(NbdError::Tls("STARTTLS while TLS is off".into())),
    }
}

/// Sends the greeting and reads the client's flags; true when the
/// client asked for no zeroes after NBD_OPT_EXPORT_NAME.
pub(crate) fn greet<R: Read, W: Write>(r: &mut R, w: &mut W) -> Result<bool, NbdError> {
    let mut greeting = NBDMAGIC.to_be_bytes().to_vec();
    greeting.extend_from_slice(&IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    w.write_all(&greeting)?;
    w.flush()?;
    let mut cf = [0u8; 4];
    r.read_exact(&mut cf)?;
    let client_flags = u32::from_be_bytes(cf);
    let known = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;
    if client_flags & !known != 0 || client_flags & FLAG_C_FIXED_NEWSTYLE == 0 {
        return Err(NbdError::BadClientFlags(client_flags));
    }
    Ok(client_flags & FLAG_C_NO_ZEROES != 0)
}

/// Reads options until the client picks an export or starts TLS.
pub(crate) fn options<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    exports: &dyn Exports,
    no_zeroes: bool,
    tls: TlsMode,
) -> Result<Outcome, NbdError> {
    let mut o = Options {
        w,
        exports,
        tls,
        structured: false,
        meta: None,
    };
    loop {
        let mut hdr = [0u8; OPTION_HEADER_LEN];
        r.read_exact(&mut hdr)?;
        let (opt, len) = decode_option_header(&hdr).map_err(|e| match e {
            DecodeError::BadMagic(m) => NbdError::BadMagic(m),
            _ => NbdError::Io(io::ErrorKind::InvalidData.into()),
        })?;
        if len > MAX_OPTION {
            return Err(NbdError::OptionTooLong(len));
        }
        let data = read_bounded(r, len)?;
        if let Some(done) = o.option(opt, &data, no_zeroes)? {
            return Ok(done);
        }
    }
}

impl<W: Write> Options<'_, W> {
    fn reply(&mut self, opt: u32, kind: u32, data: &[u8]) -> io::Result<()> {
        self.w.write_all(&option_reply(opt, kind, data))?;
        self.w.flush()
    }

    /// Handles one option; `Some` when transmission or TLS starts.
    fn option(
        &mut self,
        opt: u32,
        data: &[u8],
        no_zeroes: bool,
    ) -> Result<Option<Outcome>, NbdError> {
        if self.tls == TlsMode::Required && !matches!(opt, OPT_STARTTLS | OPT_ABORT) {
            if opt == OPT_EXPORT_NAME {
                return Err(NbdError::TlsRequired); // no error reply exists
            }
            self.reply(
                opt,
                REP_ERR_TLS_REQD,
                b"TLS required: send NBD_OPT_STARTTLS",
            )?;
            return Ok(None);
        }
        let go = |n: Option<Negotiated>| n.map(Outcome::Go);
        match opt {
            OPT_STARTTLS => self.starttls(data),
            OPT_EXPORT_NAME => self
                .export_name(data, no_zeroes)
                .map(|n| Some(Outcome::Go(n))),
            OPT_ABORT => {
                // The client may already be gone; the ack is a courtesy.
                let _ = self.reply(opt, REP_ACK, &[]);
                Err(NbdError::Aborted)
            }
            OPT_LIST if !data.is_empty() => self.invalid(opt, "NBD_OPT_LIST takes no data"),
            OPT_LIST => {
                for (name, desc) in self.exports.list() {
                    self.reply(opt, REP_SERVER, &rep_server(&name, &desc))?;
                }
                self.reply(opt, REP_ACK, &[])?;
                Ok(None)
            }
            OPT_STRUCTURED_REPLY if !data.is_empty() => self.invalid(opt, "takes no data"),
            OPT_STRUCTURED_REPLY => {
                self.structured = true;
                self.reply(opt, REP_ACK, &[])?;
                Ok(None)
            }
            OPT_INFO | OPT_GO => self.info_or_go(opt, data).map(go),
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => self.meta_context(opt, data).map(go),
            _ => {
                self.reply(opt, REP_ERR_UNSUP, b"option not supported")?;
                Ok(None)
            }
        }
    }

    /// NBD_OPT_STARTTLS: acked when TLS is required and not started yet.
    fn starttls(&mut self, data: &[u8]) -> Result<Option<Outcome>, NbdError> {
        match self.tls {
            _ if !data.is_empty() => self.invalid(OPT_STARTTLS, "takes no data"),
            TlsMode::Off => {
                self.reply(OPT_STARTTLS, REP_ERR_UNSUP, b"TLS is not offered here")?;
                Ok(None)
            }
            TlsMode::Started => self.invalid(OPT_STARTTLS, "TLS already started"),
            TlsMode::Required => {
                self.reply(OPT_STARTTLS, REP_ACK, &[])?;
                Ok(Some(Outcome::StartTls))
            }
        }
    }

    fn invalid<T>(&mut self, opt: u32, why: &str) -> Result<Option<T>, NbdError> {
        self.reply(opt, REP_ERR_INVALID, why.as_bytes())?;
        Ok(None)
    }

    /// NBD_OPT_EXPORT_NAME: no error reply exists, an unknown name closes.
    fn export_name(&mut self, data: &[u8], no_zeroes: bool) -> Result<Negotiated, NbdError> {
        let lossy = || String::from_utf8_lossy(data).into_owned();
        let name = decode_export_name(data).map_err(|_| NbdError::UnknownExport(lossy()))?;
        let export = self
            .exports
            .open(&name)
            .ok_or_else(|| NbdError::UnknownExport(name.clone()))?;
        let mut b = export.size().to_be_bytes().to_vec();
        let tf = transmission_flags(&*export, self.structured);
        b.extend_from_slice(&tf.to_be_bytes());
        if !no_zeroes {
            b.extend_from_slice(&[0u8; 124]);
        }
        self.w.write_all(&b)?;
        self.w.flush()?;
        Ok(self.negotiated(name, export))
    }

    fn negotiated(&self, name: String, export: Arc<dyn Export>) -> Negotiated {
        let base_allocation = matches!(&self.meta, Some((n, true)) if *n == name);
        Negotiated {
            name,
            export,
            structured: self.structured,
            base_allocation,
        }
    }

    fn info_or_go(&mut self, opt: u32, data: &[u8]) -> Result<Option<Negotiated>, NbdError> {
        let Ok(req) = InfoRequest::decode(data) else {
            return self.invalid(opt, "malformed info request");
        };
        let Some(export) = self.exports.open(&req.name) else {
            self.reply(opt, REP_ERR_UNKNOWN, b"no such export")?;
            return Ok(None);
        };
        let tf = transmission_flags(&*export, self.structured);
        self.reply(opt, REP_INFO, &info_export(export.size(), tf))?;
        for info in &req.infos {
            let d = match *info {
                INFO_NAME => info_text(INFO_NAME, &req.name),
                INFO_DESCRIPTION => {
                    let desc = self.exports.description(&req.name);
                    info_text(INFO_DESCRIPTION, &desc)
                }
                INFO_BLOCK_SIZE => {
                    let pref = export.block_size().clamp(512, MAX_PAYLOAD);
                    info_block_size(1, pref, MAX_PAYLOAD)
                }
                _ => continue,
            };
            self.reply(opt, REP_INFO, &d)?;
        }
        self.reply(opt, REP_ACK, &[])?;
        Ok((opt == OPT_GO).then(|| self.negotiated(req.name, export)))
    }

    fn meta_context(&mut self, opt: u32, data: &[u8]) -> Result<Option<Negotiated>, NbdError> {
        let Ok(req) = MetaRequest::decode(data) else {
            return self.invalid(opt, "malformed meta context request");
        };
        let set = opt == OPT_SET_META_CONTEXT;
        if set && !self.structured {
            return self.invalid(opt, "structured replies first");
        }
        if self.exports.open(&req.name).is_none() {
            self.reply(opt, REP_ERR_UNKNOWN, b"no such export")?;
            return Ok(None);
        }
        let matches = |q: &String| q == BASE_ALLOCATION || (!set && q == "base:");
        let chosen = if set || !req.queries.is_empty() {
            req.queries.iter().any(matches)
        } else {
            true // an empty list query lists every context
        };
        if chosen {
            let d = rep_meta_context(BASE_ALLOCATION_ID, BASE_ALLOCATION);
            self.reply(opt, REP_META_CONTEXT, &d)?;
        }
        if set {
            self.meta = Some((req.name, chosen));
        }
        self.reply(opt, REP_ACK, &[])?;
        Ok(None)
    }
}
