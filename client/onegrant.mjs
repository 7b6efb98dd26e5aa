// ES module entry of onegrant-miniprogram: the same library as onegrant.js (CommonJS).
import onegrant from './onegrant.js';

export const {
  createClient, Client, OnegrantError, ERROR_CODES, SUBSCRIBE_RESULTS, SUBSCRIBE_FAILURES, storageKeys, VERSION,
} = onegrant;
export default onegrant;
