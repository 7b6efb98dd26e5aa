// Types of onegrant-miniprogram (onegrant.js).

/** wx.request, as the library calls it. */
export interface RequestOptions {
  url: string;
  method: 'GET' | 'POST' | 'PUT';
  data?: Record<string, any>;
  header: Record<string, string>;
  timeout: number;
  success(res: { statusCode: number; data: any; header?: Record<string, string> }): void;
  fail(err: { errMsg?: string }): void;
}

export interface Storage {
  getStorageSync(key: string): any;
  setStorageSync(key: string, value: any): void;
}

export type SubscribeResult =
  | 'accept' | 'acceptWithAudio' | 'acceptWithAlert' | 'reject' | 'ban' | 'filter';

export interface ClientOptions {
  /** onegrant's API on its custom domain: an ICP-filed HTTPS domain listed in the
   *  mini-program's request domains (never the stack's execute-api URL). */
  baseUrl: string;
  /** The mini-program's `wx` (found globally when not given): storage, request, login
   *  and requestSubscribeMessage. */
  wx?: Storage & {
    request(options: RequestOptions): void;
    login(options: { success(res: { code: string }): void; fail(err: { errMsg?: string }): void }): void;
    requestSubscribeMessage(options: {
      tmplIds: string[];
      success(res: Record<string, string>): void;
      fail(err: { errMsg?: string; errCode?: number }): void;
    }): void;
    /** Optional (base library 2.10.1+): read with `withSubscriptions: true` only. */
    getSetting?: GetSetting;
  };
  /** Adapters instead of (or over) `wx`. */
  storage?: Storage;
  /** The host app's session, instead of onegrant's own wx.login (which can replace the
   *  host's session_key): resolves `{token, expires_in}` as `POST /v1/session` answers,
   *  made by the host's backend (docs/client.md). Called again once on a 401. */
  session?: (why: { refused: string | null }) => Promise<{ token: string; expires_in: number }>;
  /** Where the app's events come from (`onAppShow`, `onNetworkStatusChange`); `wx`
   *  when not given. */
  events?: {
    onAppShow?(listener: (options: unknown) => void): void;
    onNetworkStatusChange?(listener: (res: { isConnected: boolean; networkType: string }) => void): void;
  };
  request?: (options: RequestOptions) => void;
  login?: (options: { success(res: { code: string }): void; fail(err: { errMsg?: string }): void }) => void;
  requestSubscribeMessage?: (options: {
    tmplIds: string[];
    success(res: Record<string, string>): void;
    fail(err: { errMsg?: string; errCode?: number }): void;
  }) => void;
  getSetting?: GetSetting;
  /** Reminder kinds `prefetch` caches plans of (default ['water']). */
  kinds?: string[];
  /** Template id per kind. Needed for the very first tap: before any prefetch has
   *  answered, nothing else names the template to ask for (the plan's once fetched). */
  templates?: Record<string, string>;
  /** Request timeout in ms (default 10000). */
  timeout?: number;
  /** Clock and id source, for tests. */
  now?: () => number;
  newId?: (prefix: string) => string;
  /** Definite refusals of queued actions, configuration errors, actions not stored or
   *  dropped, and subscribe failures. */
  onError?: (error: OnegrantError | SubscribeFailure) => void;
}

/** Why a `wx.requestSubscribeMessage` failed, from its errCode: `switched_off` (20004,
 *  the main switch off: guide the user to wx.openSetting), `template_invalid` (20001,
 *  10004), `ui_unavailable` (10005, the app went to the background), `not_in_tap`
 *  (asked after an await), … */
export type SubscribeFailureReason =
  | 'no_templates' | 'network' | 'template_invalid' | 'ui_unavailable' | 'templates_mixed'
  | 'too_many_templates' | 'switched_off' | 'subscribe_banned' | 'template_not_allowed'
  | 'not_in_tap' | 'unknown';

export interface SubscribeFailure {
  code: 'subscribe_failed';
  /** WeChat's errCode; null when it gave none. */
  errCode: number | null;
  reason: SubscribeFailureReason;
  message: string;
}

/** A grant's state as the API answers it. */
export type GrantStatus = 'available' | 'reserved' | 'consumed' | 'invalid' | 'not_granted';

/** `wx.getSetting`, as the client calls it: only for the standing choice. */
export type GetSetting = (options: {
  withSubscriptions: true;
  success(res: { subscriptionsSetting?: { mainSwitch: boolean; itemSettings?: Record<string, string> } }): void;
  fail(err: { errMsg?: string }): void;
}) => void;

/** The standing choice as reported (`subscriptions_setting`) and cached. */
export interface SubscriptionsSetting {
  main_switch: boolean;
  item_settings: Record<string, 'accept' | 'reject' | 'ban' | 'filter'>;
  /** When it was read (the client's clock, RFC 3339): the server applies settings in
   *  the order they were read, so one read earlier that arrives later changes nothing. */
  read_at?: string;
}

export type Standing = 'accept' | 'reject' | 'ban' | 'main_switch_off';

export interface Quota {
  template_id: string;
  title: string;
  available: number;
  used: number;
  accepted: number;
  needs_grant: boolean;
  confirmed: number;
  /** The standing choice the user's settings keep; absent while none is kept. */
  standing?: Standing;
}

export interface Plan {
  kind: string;
  state: 'disabled' | 'scheduled' | 'sending' | 'awaiting_checkin' | 'paused';
  needs_grant: boolean;
  next_due_at: string | null;
  pause_reason: string | null;
  template_id: string;
  /** The template of the notice sent when this plan's grants run out, asked for in
   *  the same tap; null when the template names none. */
  refill_template_id: string | null;
  settings: {
    interval_minutes: number;
    wake_time: string;
    sleep_time: string;
    timezone: string;
    daily_goal: number;
  };
  today: { date: string; count: number };
  grant_conflict?: boolean;
  grant_limit?: boolean;
}

export interface Notification {
  id: string;
  type: string;
  title: string;
  body: string;
  page: string | null;
  read: boolean;
  created_at: string;
  push: { status: string; reason: string | null } | null;
}

export type ErrorCode =
  | 'malformed_json' | 'invalid_body' | 'invalid_query' | 'unauthorized' | 'invalid_code'
  | 'invalid_code_format' | 'not_found' | 'idempotency_conflict' | 'payload_too_large'
  | 'no_templates' | 'too_many_templates' | 'unknown_template' | 'invalid_result'
  | 'invalid_request_id' | 'invalid_action_id' | 'invalid_grant' | 'invalid_occurred_at'
  | 'invalid_count' | 'invalid_daily_goal' | 'invalid_interval' | 'invalid_time'
  | 'invalid_timezone' | 'invalid_waking_hours' | 'invalid_quiet_hours' | 'invalid_muted_types'
  | 'grant_limit' | 'rate_limited' | 'unavailable' | 'internal' | 'network' | 'expired'
  | 'configuration' | 'dropped' | 'not_stored';

export class OnegrantError extends Error {
  constructor(status: number, code: ErrorCode | string, message?: string, retryAfter?: number);
  /** HTTP status; 0 when nothing was answered. */
  readonly status: number;
  readonly code: ErrorCode | string;
  /** Seconds, when the server said (429, 503). */
  readonly retryAfter?: number;
  /** No answer (not a configuration error), 401, 429 or 5xx: the same request may
   *  succeed later. An own property. */
  readonly retryable: boolean;
}

export interface CheckInResult {
  actionId: string;
  /** Whether the tap asked for a grant: the cached plan needed one, was cached before
   *  this foreground session, or its reminder time has passed. */
  asked: boolean;
  /** What the user chose in the popup, if asked. */
  result: SubscribeResult | null;
  /** What the user chose for the refill notice's template asked in the same popup (its
   *  grant reported on its own); null when not asked or not answered. */
  refill: SubscribeResult | null;
  /** The plan the server answered (the cached one when another page sent the
   *  check-in); null while it waits in the queue; absent with `error`. */
  plan?: Plan | null;
  queued: boolean;
  /** Whether the action reached storage; false when storage refused it (full): it was
   *  kept in memory and submitted at once, lost only if the app closes first. */
  stored: boolean;
  /** Why the popup failed, when it did. */
  subscribeError: SubscribeFailure | null;
  /** The server refused the check-in for good (a definite 4xx). */
  error?: OnegrantError;
  /** While queued: the configuration error that stops submits in this app run. */
  configurationError?: OnegrantError;
}

export interface GrantsResult {
  requestId: string;
  results: Record<string, SubscribeResult>;
  /** Absent with `error`; null while the report waits in the queue. */
  grants?: Array<{ template_id: string; request_id: string; result: SubscribeResult; status: GrantStatus }> | null;
  queued: boolean;
  stored: boolean;
  subscribeError: SubscribeFailure | null;
  error?: OnegrantError;
  configurationError?: OnegrantError;
}

export class Client {
  constructor(options: ClientOptions);
  /** Storage keys of this client's session, queue and cache (per baseUrl). */
  readonly keys: { readonly session: string; readonly queue: string; readonly cache: string; readonly retryAt: string };
  /** `fresh` when everything was fetched now; else the cache as it was. */
  prefetch(): Promise<{ quotas: Quota[]; plans: Record<string, Plan>; fresh: boolean }>;
  needsGrant(kind: string): boolean;
  /** Whether a check-in's tap asks: never while the settings keep a refusing choice. */
  asks(kind: string, templateId: string): boolean;
  /** The setting as last read (at `prefetch` and after each popup), or null. */
  subscriptionsSetting(): SubscriptionsSetting | null;
  /** The template's standing choice; a refusing one is the cue for `wx.openSetting`. */
  standingOf(templateId: string): Standing | null;
  refreshSetting(): Promise<SubscriptionsSetting | null>;
  cachedPlan(kind: string): Plan | null;
  cachedQuotas(): Quota[];
  getPlan(kind: string): Promise<Plan>;
  updatePlan(kind: string, settings: {
    enabled: boolean; interval_minutes?: number; wake_time?: string; sleep_time?: string;
    timezone?: string; daily_goal?: number;
  }): Promise<Plan>;
  quotas(): Promise<Quota[]>;
  /** Call first thing in the tap handler, before any await. */
  checkIn(kind: string, options: { count: number; goal: number }): Promise<CheckInResult>;
  /** Call first thing in the tap handler, before any await. 1–3 template ids. */
  requestGrants(templateIds: string[]): Promise<GrantsResult>;
  /** Submits the queue, oldest first; one flush at a time for the whole app. */
  flush(): Promise<{ answers: Record<string, { data?: any; error?: OnegrantError }>; pending: number }>;
  pendingCount(): number;
  /** Queued actions this app run dropped because the queue was full (200). */
  droppedCount(): number;
  /** The configuration error (request domain, TLS) that stopped submits in this app
   *  run, or null. */
  configurationError(): OnegrantError | null;
  notifications(params?: { limit?: number; cursor?: string; read?: boolean; type?: string }):
    Promise<{ items: Notification[]; next_cursor: string | null }>;
  unreadCount(): Promise<number>;
  markRead(id: string): Promise<Notification>;
  markAllRead(): Promise<number>;
  getPreferences(): Promise<Preferences>;
  setPreferences(preferences: Preferences): Promise<Preferences>;
  /** Forgets the user on the server (`DELETE /v1/me`) and drops what this device keeps
   *  of them: resolves with the erasure's state. */
  erase(): Promise<'pending' | 'done'>;
  /** A copy of the user's data (`GET /v1/me/export`), every page followed. */
  exportData(): Promise<Array<{ kind: string; sk: string; [field: string]: unknown }>>;
}

export interface Preferences {
  /** Pushes wait until these end (unless `high`); times as HH:MM in an IANA zone. */
  quiet_hours: { start: string; end: string; timezone: string } | null;
  /** Notification types whose pushes are never sent (the notifications stay). */
  muted_types: string[];
}

export function createClient(options: ClientOptions): Client;
export const ERROR_CODES: readonly ErrorCode[];
export const SUBSCRIBE_RESULTS: readonly SubscribeResult[];
export const SUBSCRIBE_FAILURES: Readonly<Record<number, SubscribeFailureReason>>;
export function storageKeys(baseUrl: string): Client['keys'];
export const VERSION: string;
