'use strict';
/**
 * The client's inbox and push-preference calls, mixed into `Client.prototype` by
 * `onegrant.js`: each is one authenticated call (`this.call`), nothing queued.
 */

const { query } = require('./support.js');

const inbox = {
  /** One page, newest first: `{items, next_cursor}`. */
  notifications(params) {
    const p = params || {};
    return this.call('GET', `/v1/notifications${query({
      limit: p.limit, cursor: p.cursor, read: p.read, type: p.type,
    })}`);
  },

  unreadCount() {
    return this.call('GET', '/v1/notifications/unread-count').then((answer) => answer.unread);
  },

  markRead(id) {
    return this.call('POST', `/v1/notifications/${encodeURIComponent(id)}/read`);
  },

  /** Marks everything read, in the server's bounded steps; resolves with how many. */
  markAllRead() {
    let updated = 0;
    const step = (left) => this.call('POST', '/v1/notifications/read-all').then((answer) => {
      updated += answer.updated;
      return answer.more && left > 0 ? step(left - 1) : updated;
    });
    return step(100);
  },

  /** `{quiet_hours: {start, end, timezone} | null, muted_types: [...]}`. */
  getPreferences() {
    return this.call('GET', '/v1/preferences');
  },

  /** Replaces the preferences (both fields required; `quiet_hours` may be null). */
  setPreferences(preferences) {
    return this.call('PUT', '/v1/preferences', preferences);
  },

  /** A copy of the user's data (`GET /v1/me/export`), every page followed: the items
   *  (each with its `kind` and `sk`) in the server's order. Each page is a read call. */
  exportData() {
    const items = [];
    const page = (cursor, left) => this.call('GET', `/v1/me/export${query({ cursor })}`).then((answer) => {
      items.push(...answer.items);
      return answer.next_cursor && left > 0 ? page(answer.next_cursor, left - 1) : items;
    });
    return page(undefined, 10000);
  },

  /** Forgets the user (`DELETE /v1/me`): the server's erasure begins and resolves with
   *  its state, `'pending'` (or `'done'` once over); this device then drops what it
   *  keeps of them — the session, the queue of unsent actions, the cache. The next call
   *  signs in afresh: an empty account. */
  erase() {
    return this.call('DELETE', '/v1/me').then((answer) => {
      for (const key of [this.keys.queue, this.keys.cache, this.keys.session]) this.write(key, '');
      return answer.erasure;
    });
  },
};

module.exports = { inbox };
