// Compiled by `tsc --noEmit` (scripts/test) against miniprogram-api-typings: the
// library's typings accept the real `wx`, and a host app's use of them type-checks.
import {
  createClient, CheckInResult, GrantStatus, OnegrantError, Plan, SubscribeFailure,
} from 'onegrant-miniprogram';

const onegrant = createClient({
  baseUrl: 'https://api.example.com',
  wx,
  templates: { water: 'tmpl_water' },
  onError: (error) => {
    if ('reason' in error && error.reason === 'switched_off') {
      wx.openSetting({ withSubscriptions: true });
    }
  },
});

// A host that keeps its own login: onegrant never calls wx.login.
const hosted = createClient({
  baseUrl: 'https://api.example.com',
  session: () => new Promise<{ token: string; expires_in: number }>((resolve) => {
    wx.request({
      url: 'https://host.example.com/onegrant-token',
      success: (res) => resolve(res.data as { token: string; expires_in: number }),
    });
  }),
});

Page({
  data: { count: 0 },
  onShow() {
    onegrant.prefetch().then(({ plans }) => {
      const water: Plan | undefined = plans.water;
      if (water) this.setData({ count: water.today.count });
    });
  },
  drink() {
    onegrant.checkIn('water', { count: this.data.count + 1, goal: 8 }).then((r: CheckInResult) => {
      const failure: SubscribeFailure | null = r.subscribeError;
      if (failure && failure.errCode === 20004) wx.showToast({ title: '通知已关闭', icon: 'none' });
      if (!r.stored) wx.showToast({ title: '存储已满', icon: 'none' });
      if (r.error instanceof OnegrantError && !r.error.retryable) wx.showToast({ title: r.error.code, icon: 'none' });
    });
    hosted.requestGrants(['tmpl_order']).then((g) => {
      const statuses: GrantStatus[] = (g.grants || []).map((grant) => grant.status);
      return statuses;
    });
  },
});
