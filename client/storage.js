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
 * session's start) is kept per storage object, so every client of one app shares it
 * and two apps in one Node test process (two fake `wx`) do not.
 */

const apps = new WeakMap();
const detached = {};

/** The shared state of the app whose storage is `storage`. */
function appOf(storage) {
  const owner = storage && (typeof storage === 'object' || typeof storage === 'function') ? storage : detached;
  let app = apps.get(owner);
  if (!app) {
    app = {
      // key -> {value, partial}: what could not be written (partial: stored items could
      // not be read either, so the memory holds only what was added since).
      memory: new Map(),
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

/** `key`'s value: the memory's when a write of it failed, else storage's, else
 *  `fallback` (never set, or unreadable). Never throws. */
function load(storage, app, key, fallback) {
  const kept = app.memory.get(key);
  if (kept && !kept.partial) return copy(kept.value);
  try {
    const value = storage.getStorageSync(key);
    return empty(value) ? fallback : value;
  } catch (e) {
    return kept ? copy(kept.value) : fallback;
  }
}

/** Writes `value`; whether storage took it (if not, the app keeps it in memory). */
function save(storage, app, key, value) {
  try {
    storage.setStorageSync(key, value);
    app.memory.delete(key);
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

module.exports = { appOf, load, save, loadQueue, saveQueue };
