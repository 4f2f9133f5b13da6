// A device's terminal view of the room's turns: headers, pieces, a retract, two heads whose
// turns overlap, and log lines that never share a line with the text.
#include "text_view.h"

#include <gtest/gtest.h>

namespace daisy::node {
namespace {

using wire::Text;
using wire::TextKind;

class TextViewTest : public ::testing::Test {
 protected:
  std::string out_;
  TextView view_{[this](std::string_view b) { out_ += b; }};
};

TEST_F(TextViewTest, ATurnIsAHeaderItsTextAndAClosingLine) {
  view_.On("k1", "head 'a'", Text{1, TextKind::kBegin, 0, -1, ""});
  view_.On("k1", "head 'a'", Text{1, TextKind::kPiece, 0, 5, "Once"});
  view_.On("k1", "head 'a'", Text{1, TextKind::kPiece, 1, 6, ""});  // a character not yet whole
  view_.On("k1", "head 'a'", Text{1, TextKind::kPiece, 2, 7, " upon"});
  view_.On("k1", "head 'a'", Text{1, TextKind::kEnd, 3, -1, "!"});
  EXPECT_EQ(out_, "--- text of a turn by head 'a' ---\nOnce upon!\n--- end of the turn by head 'a' (3 tokens) ---\n");
}

TEST_F(TextViewTest, ALogLineStartsALineAndTheTextGoesOnAfterIt) {
  view_.On("k1", "h", Text{1, TextKind::kBegin, 0, -1, ""});
  view_.On("k1", "h", Text{1, TextKind::kPiece, 0, 5, "one"});
  view_.BreakLine();
  out_ += "[log line]\n";
  view_.BreakLine();  // at a line's start already: nothing
  view_.On("k1", "h", Text{1, TextKind::kPiece, 1, 6, " two\n"});
  view_.On("k1", "h", Text{1, TextKind::kEnd, 2, -1, ""});
  EXPECT_EQ(out_, "--- text of a turn by h ---\none\n[log line]\n two\n--- end of the turn by h (2 tokens) ---\n");
}

TEST_F(TextViewTest, ARetractShowsTheKeptTextAgainAndTheReplayGoesOn) {
  view_.On("k1", "h", Text{1, TextKind::kBegin, 0, -1, ""});
  for (int i = 0; i < 4; ++i) view_.On("k1", "h", Text{1, TextKind::kPiece, i, 10 + i, std::string(1, 'a' + i)});
  view_.On("k1", "h", Text{1, TextKind::kRetract, 2, -1, ""});
  view_.On("k1", "h", Text{1, TextKind::kPiece, 2, 20, "X"});
  view_.On("k1", "h", Text{1, TextKind::kEnd, 3, -1, ""});
  EXPECT_EQ(out_,
            "--- text of a turn by h ---\nabcd\n--- the audit withdrew the text after token 2 of h's turn; it goes "
            "on from there ---\nabX\n--- end of the turn by h (3 tokens) ---\n");
}

TEST_F(TextViewTest, TwoHeadsAtOnceAreNamedWhereverTheyTakeTurns) {
  view_.On("k1", "a", Text{1, TextKind::kBegin, 0, -1, ""});
  view_.On("k1", "a", Text{1, TextKind::kPiece, 0, 5, "one"});
  view_.On("k2", "b", Text{7, TextKind::kBegin, 0, -1, ""});
  view_.On("k2", "b", Text{7, TextKind::kPiece, 0, 5, "uno"});
  view_.On("k1", "a", Text{1, TextKind::kPiece, 1, 6, " two"});
  view_.On("k1", "a", Text{1, TextKind::kFailed, 2, -1, ""});
  view_.On("k2", "b", Text{7, TextKind::kEnd, 1, -1, ""});
  EXPECT_EQ(out_,
            "--- text of a turn by a ---\none\n--- text of a turn by b ---\nuno\n--- a (continued) ---\n two\n"
            "--- the turn by a failed after 2 tokens ---\n--- end of the turn by b (1 tokens) ---\n");
}

TEST_F(TextViewTest, TextOfAStreamNeverBegunOrFromAnotherKeyIsNotShown) {
  view_.On("k1", "a", Text{1, TextKind::kPiece, 0, 5, "stray"});
  view_.On("k1", "a", Text{1, TextKind::kBegin, 0, -1, ""});
  view_.On("k2", "b", Text{1, TextKind::kPiece, 0, 5, "forged"});  // same stream number, another head
  view_.On("k1", "a", Text{1, TextKind::kPiece, 1000000, 5, "far ahead"});
  EXPECT_EQ(out_, "--- text of a turn by a ---\n");
}

}  // namespace
}  // namespace daisy::node
