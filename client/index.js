'use strict';
// The entry WeChat DevTools' "构建 npm" resolves: `require('onegrant-miniprogram')` in a
// mini-program loads miniprogram_npm/onegrant-miniprogram/index.js, never package.json's
// `main`. The library is onegrant.js.
module.exports = require('./onegrant.js');
