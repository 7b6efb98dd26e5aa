// The water reminder page: one check-in button. The library asks for the next
// reminder's grant inside the tap (only when the server says one is needed), records
// the check-in first and queues it while offline.
const { createClient } = require('onegrant-miniprogram');

// templates: asked for on the very first tap, before any prefetch has answered.
const onegrant = createClient({
  baseUrl: 'https://api.example.com',
  templates: { water: 'YOUR_WATER_TEMPLATE_ID' },
});

Page({
  data: { count: 0, goal: 8, needsGrant: true, pending: 0 },

  onShow() {
    // Quotas and plans cached now, so the tap never waits for the network.
    // Resolves with the cache when offline.
    onegrant.prefetch().then(({ plans }) => {
      if (plans.water) this.show(plans.water);
      this.setData({ pending: onegrant.pendingCount() });
    });
  },

  // bindtap="drink": checkIn first, before any await.
  drink() {
    const count = this.data.count + 1;
    this.setData({ count });
    onegrant.checkIn('water', { count, goal: this.data.goal }).then((r) => {
      if (r.error) wx.showToast({ title: '记录失败', icon: 'none' });
      if (r.plan) this.show(r.plan);
      this.setData({ pending: onegrant.pendingCount() });
    });
  },

  /** @param {import('onegrant-miniprogram').Plan} plan */
  show(plan) {
    this.setData({
      count: plan.today ? plan.today.count : 0,
      goal: plan.settings.daily_goal,
      needsGrant: plan.needs_grant,
      pending: onegrant.pendingCount(),
    });
  },
});
