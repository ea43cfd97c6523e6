// Entry point of the workflow bundle: every workflow type the workers register.
export { campaign } from './campaign.js';
