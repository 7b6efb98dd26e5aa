'use strict';
/**
 * Storage that never throws out of a tap, and the state one mini-program shares across
 * its pages.
 *
 * `wx.setStorageSync` throws past 1 MB per key or 10 MB per app (the host app's data
 * counts) and `wx.getStorageSync` can throw too. Every access here is guarded: a value
 * whose write failed is kept in memory (the app's copy, read before storage until a
 * write of it succeeds), so an action recorded in a full storage is still submitted
 * while the app lives, and the caller is told it was not stored.
 *
 * Every page of a mini-program runs in one JavaScript context with one `wx`: the app's
 * state (that memory, the one flush per queue, the recent answers, the foreground
 * session's start) is kept per `wx` (per storage only when no `wx` is given), so every
 * client of one app shares it, whatever adapters each page passes, and two apps in one
 * Node test process (two fake `wx`) do not.
 */

const apps = new WeakMap();
const detached = {};

/** The shared state of the app `owner` (its `wx`, else its storage) stands for. */
function appOf(identity) {
  const owner = identity && (typeof identity === 'object' || typeof identity === 'function') ? identity : detached;
  let app = apps.get(owner);
  if (!app) {
    app = {
      // key -> {value, partial}: what could not be written (partial: stored items could
      // not be read either, so the memory holds only what was added since).
      memory: new Map(),
      // key -> the value last written, which storage holds (no other context writes it):
      // read back when a read throws.
      written: new Map(),
      // queue key -> the flush that runs after the current one, shared by its waiters.
      followUps: new Map(),
      // Failures reported once per app run (by code), so a loop never floods onError.
      reported: new Set(),
      // queue key -> the flush running now.
      flushes: new Map(),
      // queue key -> (action id -> answer): the latest answers, whichever page sent them.
      answers: new Map(),
      // queue key -> the configuration error that stopped its submits in this app run.
      misconfigured: new Map(),
      // session key -> the login in flight: every page waits for the same one.
      logins: new Map(),
      // queue key -> the client the platform's events flush through, and its timer.
      clients: new Map(),
      timers: new Map(),
      hooked: false,
      foregroundSince: null,
      dropped: 0,
    };
    apps.set(owner, app);
  }
  return app;
}

function copy(value) {
  return value === undefined ? undefined : JSON.parse(JSON.stringify(value));
}

function empty(value) {
  return value === '' || value === undefined || value === null;
}

/** `key`'s value and whether it is unknown: the memory's when a write of it failed,
 *  else storage's, else (a read that throws) the value last written, else `fallback`
 *  with `unknown` true. Never throws. */
function loadChecked(storage, app, key, fallback) {
  const kept = app.memory.get(key);
  if (kept && !kept.partial) return { value: copy(kept.value), unknown: false };
  try {
    const value = storage.getStorageSync(key);
    return { value: empty(value) ? fallback : value, unknown: false };
  } catch (e) {
    if (app.written.has(key)) return { value: copy(app.written.get(key)), unknown: false };
    return { value: kept ? copy(kept.value) : fallback, unknown: true };
  }
}

/** `key`'s value, or `fallback` (never set, or unknown). Never throws. */
function load(storage, app, key, fallback) {
  return loadChecked(storage, app, key, fallback).value;
}

/** Writes `value`; whether storage took it (if not, the app keeps it in memory). */
function save(storage, app, key, value) {
  try {
    storage.setStorageSync(key, value);
    app.memory.delete(key);
    app.written.set(key, copy(value));
    return true;
  } catch (e) {
    app.memory.set(key, { value: copy(value), partial: false });
    return false;
  }
}

/** The queue at `key`, oldest first, and whether it is whole: when storage cannot be
 *  read, only what this app added since (kept in memory) is known, and the stored
 *  items must not be overwritten; once storage reads again, both are merged. */
function loadQueue(storage, app, key) {
  const kept = app.memory.get(key);
  if (kept && !kept.partial) return { items: copy(kept.value), whole: true };
  let stored;
  try {
    stored = storage.getStorageSync(key);
  } catch (e) {
    if (app.written.has(key) && !kept) return { items: copy(app.written.get(key)), whole: true };
    return { items: kept ? copy(kept.value) : [], whole: false };
  }
  // Anything but an action (a corrupt entry) is left out rather than stop the queue.
  const items = (Array.isArray(stored) ? stored : []).filter((i) => i && typeof i === 'object' && i.id);
  if (!kept) return { items, whole: true };
  const known = new Set(items.map((i) => i.id));
  const merged = items.concat(kept.value.filter((i) => !known.has(i.id)))
    .sort((a, b) => (a.createdAt || 0) - (b.createdAt || 0));
  saveQueue(storage, app, key, merged, true);
  return { items: merged, whole: true };
}

/** Writes the queue; a queue that is not whole stays in memory only. Whether it is
 *  stored. */
function saveQueue(storage, app, key, items, whole) {
  if (!whole) {
    app.memory.set(key, { value: copy(items), partial: true });
    return false;
  }
  return save(storage, app, key, items);
}

module.exports = { appOf, load, loadChecked, save, loadQueue, saveQueue };
