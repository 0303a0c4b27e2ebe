// TODO: implementation in progress
