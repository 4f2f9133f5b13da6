// TurnText: the head's text of each token through a turn's stop strings, withdrawn tokens
// and the text the head holds back to the end. No model: the pieces are made up.
#include "turn_text.h"

#include <gtest/gtest.h>

namespace daisy::srv {
namespace {

std::string Shown(std::optional<std::string> s) {
  EXPECT_TRUE(s.has_value());
  return s.value_or("<ignored>");
}

TEST(TurnText, AStopStringAcrossTokensEndsTheTextAndLaterTokensAreNotCounted) {
  TurnText t({"END"});
  std::string shown = Shown(t.Add("Once"));
  shown += Shown(t.Add(" upon E"));
  shown += Shown(t.Add("N"));
  EXPECT_FALSE(t.stopped());
  shown += Shown(t.Add("D of it"));
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(shown, "Once upon ");
  EXPECT_FALSE(t.Add("more").has_value());
  t.HoldBack("tail");
  EXPECT_EQ(t.Finish(), "");
  EXPECT_EQ(t.text(), "Once upon ");
  EXPECT_EQ(t.tokens(), 4);
}

TEST(TurnText, ARetractKeepsTheFirstTokensAndTheHeldBackTextComesAtTheEnd) {
  TurnText t({"zz"});
  (void)t.Add("a");
  (void)t.Add("b");
  (void)t.Add("c");
  EXPECT_EQ(t.Retract(1), "a");
  EXPECT_EQ(t.tokens(), 1);
  EXPECT_EQ(Shown(t.Add("B")), "B");
  EXPECT_EQ(Shown(t.Add("z")), "");  // could start the stop string: held
  t.HoldBack("\xc3\xa9");
  EXPECT_EQ(t.Finish(), "z\xc3\xa9");
  EXPECT_EQ(t.text(), "aBz\xc3\xa9");
  EXPECT_EQ(t.tokens(), 3);
  EXPECT_FALSE(t.stopped());
}

TEST(TurnText, TheHeldBackTextCanCompleteAStopString) {
  TurnText t({"!!"});
  (void)t.Add("hi!");
  t.HoldBack("!x");
  EXPECT_EQ(t.Finish(), "");
  EXPECT_EQ(t.text(), "hi");
  EXPECT_TRUE(t.stopped());
}

}  // namespace
}  // namespace daisy::srv
