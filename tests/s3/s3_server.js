#!/usr/bin/env node
// A real S3-compatible server for the tests: @20minutes/s3rver on loopback,
// with AWS's `If-None-Match: *` create-only semantics added, because s3rver
// ignores conditional headers on writes and fleetfs's s3:// replicas rely on
// them to never overwrite an object another agent wrote.
//
//   node --openssl-legacy-provider s3_server.js --dir DATA [--port 0] [--modules CACHE] [--no-conditional]
//                     [--verbose] BUCKET...
//
// Prints `listening PORT` on stdout once the buckets exist and the socket
// accepts; exits 0 on SIGTERM or SIGINT. Test code only.
'use strict';

const path = require('path');
const fs = require('fs');

function usage(message) {
  process.stderr.write(`s3_server: ${message}\n` +
    'usage: s3_server.js --dir DATA [--port N] [--modules DIR] [--no-conditional] [--verbose] BUCKET...\n');
  process.exit(2);
}

function parseArgs(argv) {
  const args = { port: 0, dir: null, modules: null, conditional: true, verbose: false, buckets: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--port') args.port = Number(value());
    else if (a === '--dir') args.dir = value();
    else if (a === '--modules') args.modules = value();
    else if (a === '--no-conditional') args.conditional = false;
    else if (a === '--verbose') args.verbose = true;
    else if (a.startsWith('--')) usage(`unknown option ${a}`);
    else args.buckets.push(a);
  }
  if (!args.dir) usage('--dir is required');
  if (!Number.isInteger(args.port) || args.port < 0 || args.port > 65535) usage('--port must be 0..65535');
  return args;
}

// The package directory: --modules may name the cache folder (holding
// node_modules/) or a node_modules folder; otherwise NODE_PATH finds it.
function findS3rver(modules) {
  const candidates = [];
  if (modules) {
    candidates.push(path.join(modules, 'node_modules', '@20minutes', 's3rver'));
    candidates.push(path.join(modules, '@20minutes', 's3rver'));
  }
  for (const dir of candidates) {
    if (fs.existsSync(path.join(dir, 'package.json'))) return dir;
  }
  try {
    return path.dirname(require.resolve('@20minutes/s3rver/package.json'));
  } catch (err) {
    process.stderr.write('s3_server: @20minutes/s3rver not found ' +
      `(looked in ${candidates.join(', ') || 'no --modules'} and NODE_PATH=${process.env.NODE_PATH || ''}); ` +
      'run packaging/install-deps.sh\n');
    process.exit(2);
  }
}

// Serializes the writes to one key, so that a conditional create's existence
// check and its write are one step: of two racing creates exactly one wins.
class KeyLocks {
  constructor() { this.tails = new Map(); }
  async run(name, fn) {
    const previous = this.tails.get(name) || Promise.resolve();
    let release;
    const mine = new Promise((resolve) => { release = resolve; });
    const tail = previous.then(() => mine);
    this.tails.set(name, tail);
    await previous;
    try {
      return await fn();
    } finally {
      release();
      if (this.tails.get(name) === tail) this.tails.delete(name);
    }
  }
}

// Wraps the object controller's writes. This runs where the router calls the
// controller, i.e. after s3rver has authenticated the request and found the
// bucket, as AWS does (a bad signature is 403, a missing bucket 404, before
// any precondition is looked at).
function addConditionalWrites(s3rverDir, S3Error) {
  const objectCtrl = require(path.join(s3rverDir, 'lib', 'controllers', 'object'));
  const locks = new KeyLocks();
  const conditional = (name) => {
    const original = objectCtrl[name];
    if (typeof original !== 'function') throw new Error(`s3rver has no object controller ${name}`);
    objectCtrl[name] = async function (ctx) {
      const { bucket, key } = ctx.params;
      return locks.run(`${bucket}/${key}`, async () => {
        const noneMatch = ctx.get('if-none-match');
        if (noneMatch !== '' && noneMatch.trim() === '*' &&
            (await ctx.store.existsObject(bucket, key))) {
          throw new S3Error('PreconditionFailed',
            'At least one of the pre-conditions you specified did not hold',
            { Condition: 'If-None-Match', RequestId: requestId(), HostId: 'fleetfs-test-s3rver' });
        }
        return original.call(this, ctx);
      });
    };
  };
  const locked = (name) => {
    const original = objectCtrl[name];
    if (typeof original !== 'function') throw new Error(`s3rver has no object controller ${name}`);
    objectCtrl[name] = async function (ctx) {
      return locks.run(`${ctx.params.bucket}/${ctx.params.key}`, () => original.call(this, ctx));
    };
  };
  conditional('putObject');
  conditional('completeMultipartUpload');
  // Unconditional writes to the key take the same lock, so a conditional
  // create never interleaves with them.
  locked('putObjectCopy');
  locked('deleteObject');
}

// s3rver lists in the order of its on-disk names ("a/b" before "a", since a
// key's file is "a._S3rver_object" beside the directory "a"), and truncates
// in that order, so paging with the last key as the next start-after loses
// keys. AWS lists in UTF-8 byte order, and its clients page on that; this
// sorts the whole listing and truncates it afterwards, keys and common
// prefixes together, as AWS counts both against max-keys.
function listInKeyOrder(store) {
  const original = store.listObjects.bind(store);
  store.listObjects = async function (bucket, options) {
    const maxKeys = options.maxKeys === undefined ? Infinity : options.maxKeys;
    const all = await original(bucket, { ...options, maxKeys: Infinity });
    const byBytes = (a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b));
    const entries = [
      ...all.objects.map((object) => ({ name: object.key, object })),
      ...all.commonPrefixes.map((prefix) => ({ name: prefix, prefix })),
    ].sort((a, b) => byBytes(a.name, b.name));
    let page = entries.slice(0, maxKeys);
    // s3rver's NextContinuationToken is the page's last object: end the
    // page there, so prefixes after it come again on the next page rather
    // than twice.
    if (entries.length > page.length && page.some((e) => e.object)) {
      while (!page[page.length - 1].object) page = page.slice(0, -1);
    }
    return {
      objects: page.filter((e) => e.object).map((e) => e.object),
      commonPrefixes: page.filter((e) => e.prefix).map((e) => e.prefix),
      isTruncated: entries.length > page.length,
    };
  };
}

// Range GETs as AWS answers them. s3rver reads `bytes=-N` (the last N bytes)
// as `bytes=0-N`, and `bytes=0-0` (one byte) as the whole object, because
// it tests the end with ||; and it answers `bytes=0-` on an empty object
// with 206 where AWS says 416.
function fixRanges(s3rverDir, store) {
  const objectCtrl = require(path.join(s3rverDir, 'lib', 'controllers', 'object'));
  const S3Object = require(path.join(s3rverDir, 'lib', 'models', 'object'));
  const { createReadStream } = require('fs');

  const getObject = objectCtrl.getObject;
  objectCtrl.getObject = async function (ctx) {
    const suffix = /^bytes=-(\d+)$/.exec(ctx.headers.range || '');
    if (suffix) {
      let size = null;
      try {
        size = Number((await ctx.store.getMetadata(ctx.params.bucket, ctx.params.key))['content-length']);
      } catch (err) {
        if (err.code !== 'ENOENT') throw err;
      }
      if (size !== null) {
        const n = Number(suffix[1]);
        // An empty suffix or object has no bytes to give: start past the end.
        ctx.headers.range = n === 0 || size === 0
          ? `bytes=${size}-`
          : `bytes=${Math.max(0, size - n)}-${size - 1}`;
      }
    }
    return getObject.call(this, ctx);
  };

  store.getObject = async function (bucket, key, options) {
    let metadata;
    try {
      metadata = await this.getMetadata(bucket, key);
    } catch (err) {
      if (err.code === 'ENOENT') return null;
      throw err;
    }
    const size = Number(metadata['content-length']);
    const ranged = options && (options.start !== undefined || options.end !== undefined);
    const range = ranged
      ? { start: options.start || 0, end: Math.min(options.end === undefined ? Infinity : options.end, size - 1) }
      : { start: 0, end: Math.max(0, size - 1) };
    if (ranged && !(range.start >= 0 && range.start < size && range.start <= range.end)) {
      const object = new S3Object(bucket, key, null, metadata);
      object.range = range; // no content: the controller answers 416
      return object;
    }
    const content = await new Promise((resolve, reject) => {
      const stream = createReadStream(this.getResourcePath(bucket, key, 'object'),
        size === 0 ? {} : range)
        .on('error', reject)
        .on('open', () => resolve(stream));
    });
    const object = new S3Object(bucket, key, content, metadata);
    if (ranged) object.range = range;
    return object;
  };
}

// A PUT whose body breaks off (the client killed, the connection reset)
// stores nothing, as on AWS. s3rver stores whatever arrived before the
// stream ended: a writer killed mid-upload left a short or empty object,
// and with If-None-Match: * that object then holds the name. The body is
// read whole and counted against Content-Length before the store sees it.
// Only a PUT's own body (the request stream); multipart completions and
// aws-chunked bodies pass as they come.
function refuseIncompleteBodies(store, S3Error) {
  const { IncomingMessage } = require('http');
  const { Readable } = require('stream');
  const original = store.putObject.bind(store);
  store.putObject = async function (object) {
    const content = object.content;
    if (!(content instanceof IncomingMessage)) return original(object);
    const declared = Number(object.metadata['content-length']);
    const chunks = [];
    let received = 0;
    const complete = await new Promise((resolve) => {
      // Ended before this ran (the conditional check awaits first): no
      // event will come, and waiting would hold the key's lock forever.
      if (content.destroyed || content.aborted) {
        resolve(false);
        return;
      }
      content.on('data', (chunk) => { chunks.push(chunk); received += chunk.length; });
      content.on('end', () => resolve(true));
      content.on('aborted', () => resolve(false));
      content.on('error', () => resolve(false));
      content.on('close', () => { if (!content.complete) resolve(false); });
    });
    if (!complete || !Number.isInteger(declared) || received !== declared) {
      throw new S3Error('IncompleteBody',
        'You did not provide the number of bytes specified by the Content-Length HTTP header',
        { RequestId: requestId(), HostId: 'fleetfs-test-s3rver' });
    }
    return original({ ...object, content: Readable.from([Buffer.concat(chunks)]) });
  };
}

let requestCounter = 0;
function requestId() {
  requestCounter += 1;
  return `FLEETFS${String(requestCounter).padStart(9, '0')}`;
}

// s3rver makes ListObjectsV2 continuation tokens with DES, which OpenSSL 3
// keeps in its legacy provider: without it every truncated listing is a 500.
function checkDes() {
  try {
    require('crypto').createCipheriv('des', Buffer.alloc(8), Buffer.alloc(8));
  } catch (err) {
    process.stderr.write('s3_server: DES is unavailable (' + err.message + '); s3rver needs it for ' +
      'ListObjectsV2 continuation tokens: run node --openssl-legacy-provider s3_server.js ...\n');
    process.exit(2);
  }
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  checkDes();
  const s3rverDir = findS3rver(args.modules);
  const S3rver = require(s3rverDir);
  const S3Error = require(path.join(s3rverDir, 'lib', 'models', 'error'));
  if (args.conditional) addConditionalWrites(s3rverDir, S3Error);

  fs.mkdirSync(args.dir, { recursive: true });
  const server = new S3rver({
    address: '127.0.0.1',
    port: args.port,
    directory: args.dir,
    silent: !args.verbose,
    configureBuckets: args.buckets.map((name) => ({ name })),
  });
  listInKeyOrder(server.store);
  refuseIncompleteBodies(server.store, S3Error);
  fixRanges(s3rverDir, server.store);
  const { port } = await server.run();

  let stopping = false;
  const stop = () => {
    if (stopping) return;
    stopping = true;
    // Keep-alive connections would hold close() open; the tests are done.
    server.httpServer.closeAllConnections();
    server.close().then(() => process.exit(0), () => process.exit(0));
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);

  process.stdout.write(`listening ${port}\n`);
}

main().catch((err) => {
  process.stderr.write(`s3_server: ${err.stack || err}\n`);
  process.exit(1);
});
