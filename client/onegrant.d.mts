// Types of onegrant-miniprogram's ES module entry (onegrant.mjs).
export * from './onegrant.js';
import type * as onegrant from './onegrant.js';
declare const all: typeof onegrant;
export default all;
