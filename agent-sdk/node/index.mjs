// The ES module entry: the same objects as index.js (one copy of the addon and its classes).
import muster from './index.js'

export const {
  Client,
  MAX_BATCH,
  MAX_PAGE,
  MusterError,
  ConnectError,
  ConnectionLost,
  ProtocolError,
  InvalidInput,
  ServerError,
  BadRequest,
  UnknownOp,
  NotFound,
  AlreadyExists,
  LeaseLost,
  InvalidState,
  TooLarge,
  LimitExceeded,
  Unauthorized,
  Forbidden,
  Replaced,
  ShuttingDown,
  DiskFull,
  NotLeader,
  OutcomeUnknown,
  StaleToken,
} = muster
export default muster
