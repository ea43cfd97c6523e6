// Search attributes that make campaigns listable and filterable (`moerl list`, Temporal UI).
// The dev server is started with exactly these; a production namespace must register them
// once (`temporal operator search-attribute create`, see docs/operations.md).
import { defineSearchAttributeKey, SearchAttributeType } from '@temporalio/common';

export const campaignNameKey = defineSearchAttributeKey('CampaignName', SearchAttributeType.KEYWORD);
export const iterationKey = defineSearchAttributeKey('Iteration', SearchAttributeType.INT);
export const campaignStatusKey = defineSearchAttributeKey('CampaignStatus', SearchAttributeType.KEYWORD);
export const meanRewardKey = defineSearchAttributeKey('MeanReward', SearchAttributeType.DOUBLE);

export const campaignSearchAttributes = [campaignNameKey, iterationKey, campaignStatusKey, meanRewardKey];
