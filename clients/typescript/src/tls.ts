/**
 * TLS to idgen nodes: the CA that signed the nodes' certificates, an
 * optional client certificate for nodes that require one (mTLS), and an
 * optional server name for nodes known by IP address whose certificates
 * name a host. Also the words that tell a user what a failed connection
 * means.
 */
import { readFileSync } from 'node:fs';
import * as grpc from '@grpc/grpc-js';

import { ConfigError } from './errors';

/** How the client speaks TLS to the nodes. */
export interface TlsOptions {
  /** The CA certificate(s), PEM, that signed the nodes' certificates: a Buffer/string of PEM, or `caFile`. */
  ca?: Buffer | string;
  /** A file holding `ca`. */
  caFile?: string;
  /** A client certificate chain, PEM (for nodes with `server.tls.client_ca`). */
  cert?: Buffer | string;
  certFile?: string;
  /** The client certificate's private key, PEM. */
  key?: Buffer | string;
  keyFile?: string;
  /** Check every node's certificate against this name instead of the address's host. */
  serverName?: string;
}

/** The channel credentials and options of `tls`; a ConfigError naming the file or part that is wrong. */
export function tlsCredentials(tls: TlsOptions): {
  credentials: grpc.ChannelCredentials;
  options: grpc.ChannelOptions;
  identity: boolean;
} {
  const ca = pem('CA', tls.ca, tls.caFile);
  if (!ca) throw new ConfigError('TLS: give the CA (ca or caFile) that signed the nodes\' certificates');
  if (!ca.toString('utf8').includes('-----BEGIN CERTIFICATE-----')) {
    throw new ConfigError('TLS CA: no PEM certificate found (expected -----BEGIN CERTIFICATE-----)');
  }
  const cert = pem('client certificate', tls.cert, tls.certFile);
  const key = pem('client key', tls.key, tls.keyFile);
  if ((cert === undefined) !== (key === undefined)) {
    throw new ConfigError('TLS: give both the client certificate and its key, or neither');
  }
  let credentials: grpc.ChannelCredentials;
  try {
    credentials = grpc.credentials.createSsl(ca, key ?? null, cert ?? null);
  } catch (e) {
    throw new ConfigError(`TLS: ${(e as Error).message}`);
  }
  const options: grpc.ChannelOptions = {};
  if (tls.serverName) options['grpc.ssl_target_name_override'] = tls.serverName;
  return { credentials, options, identity: cert !== undefined };
}

function pem(what: string, inline: Buffer | string | undefined, file: string | undefined): Buffer | undefined {
  if (inline !== undefined && file !== undefined) {
    throw new ConfigError(`TLS ${what}: give it inline or as a file, not both`);
  }
  if (inline !== undefined) return Buffer.isBuffer(inline) ? inline : Buffer.from(inline, 'utf8');
  if (file === undefined) return undefined;
  try {
    return readFileSync(file);
  } catch (e) {
    throw new ConfigError(`TLS ${what}: cannot read ${file}: ${(e as Error).message}`);
  }
}

/**
 * What a failed connection means, in words that say what to do, from the
 * error text and how the client speaks TLS. Never tells a client that has
 * TLS set to set it.
 */
export function failureWords(cause: string, tls: boolean, identity: boolean): string {
  const lower = cause.toLowerCase();
  const has = (words: string[]) => words.some((w) => lower.includes(w));
  if (has(['certificate required', 'certificate_required', 'alert number 116'])) {
    return identity
      ? 'TLS: the node requires a client certificate and did not take this one: check the tls cert and key'
      : 'TLS: the node requires a client certificate: set tls.certFile and tls.keyFile';
  }
  if (identity && has(['bad certificate', 'bad_certificate', 'unknown ca', 'unknown_ca', 'certificate unknown', 'alert number 42', 'alert number 48'])) {
    return "TLS: the node refused the client certificate: it must be signed by the node's server.tls.client_ca, unexpired, X.509 v3 with clientAuth usage";
  }
  if (has(['self-signed', 'self signed', 'unable to verify', 'unable to get', 'certificate', 'altnames', 'hostname/ip does not match'])) {
    return "TLS: the node's certificate is not trusted: check the CA and the server name (tls.caFile, tls.serverName)";
  }
  if (tls && has(['wrong version number', 'packet length too long', 'ssl routines'])) {
    return 'TLS: the node does not speak TLS; it serves plaintext: drop the tls option';
  }
  const broke = has(['econnreset', 'connection dropped', 'rst_stream', 'protocol error', 'socket hang up', 'closed']);
  if (!tls && broke) return 'the connection broke; the node may speak TLS: set the tls option';
  if (tls && broke) {
    return identity
      ? 'the connection closed during or right after the TLS handshake (the node may have refused the client certificate)'
      : 'the connection closed during or right after the TLS handshake: if the node requires a client certificate (server.tls.client_required), set tls.certFile and tls.keyFile';
  }
  if (has(['econnrefused', 'refused'])) {
    return 'connection refused: nothing listens there (is idgen serving at this address? A node that is shutting down or restarting refuses connections too)';
  }
  if (has(['timed out', 'timeout', 'etimedout'])) return 'timed out connecting: the node or its network does not answer';
  return 'the connection failed';
}
